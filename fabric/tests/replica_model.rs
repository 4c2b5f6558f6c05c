//! Exhaustive model check of the replica protocol between a region's home and its standby (`agent/backups.rs`,
//! `replication.rs`, `failover.rs`), with the agent's own rules for when a home serves alone and when a
//! standby takes over (`vfabric::agent::{serves_alone, may_take_over}`), on a discrete clock. Every
//! interleaving, up to the bounds below, of: the home writing (applied, then copied to the standby; answered
//! once the standby acknowledges), probing its standby, serving reads, sending heartbeats, freezing, waking and
//! crashing; messages delivered in any order, late, or lost (a lost exchange times out at the home); the
//! standby taking over, and callers writing and reading there; the clock ticking. Checked in every state
//! reached:
//! - no acknowledged write is lost: a standby that takes over has every acknowledged write;
//! - no read is stale: a read, at the home or at the standby, returns the last acknowledged write or a later
//!   one.
//!
//! The same with two standbys (a region kept on three nodes): the home's exchanges go to both and a write is
//! answered once both acknowledge it, and a standby takes over only if it is the first to claim the takeover
//! (etcd's compare-and-swap in the agent, one register here).
//!
//! Three more tests turn a safeguard off each and check that the model then finds what it prevents: a home that
//! serves whenever it is up serves a stale read; a standby that takes an exchange delivered late, over a newer
//! one, loses an acknowledged write; two standbys that take over without a claim both serve, one without the other's writes.
//! The checks can fail.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use vfabric::agent::{may_take_over, serves_alone};

/// `dead_after`, in ticks. Times are kept as ages capped at it (the rules only compare them with it and its
/// half), so the model covers any length of time.
const DEAD_AFTER: u8 = 2;

/// How far the model explores: standby copies, writes issued in all (values 1..=writes; a later write has a
/// larger value), messages in flight at once, and exchanges the home starts in all (writes and probes).
#[derive(Debug, Clone, Copy)]
struct Bounds {
    standbys: u8,
    writes: u8,
    in_flight: usize,
    exchanges: u8,
}

/// One standby: the home's region and a copy (`replicas = 2`).
const ONE_STANDBY: Bounds = Bounds { standbys: 1, writes: 3, in_flight: 3, exchanges: 4 };
/// Two standbys (`replicas = 3`).
const TWO_STANDBYS: Bounds = Bounds { standbys: 2, writes: 2, in_flight: 3, exchanges: 2 };

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Msg {
    /// The home's bytes to standby `to` (a write's, or the whole region's on a probe after a lost exchange), as
    /// the home's exchange `seq`.
    Replicate { to: u8, value: u8, seq: u8 },
    /// Standby `from` took exchange `seq`.
    Ack { from: u8, seq: u8 },
    /// A standby had taken over.
    Moved,
    /// A heartbeat from the home to standby `to`.
    Ping { to: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Up {
    Running,
    Frozen,
    Crashed,
}

/// A standby copy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Copy {
    value: u8,
    /// How long since it last heard from the home.
    silent: u8,
    promoted: bool,
    /// The last exchange it took.
    seq_taken: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    // The home.
    home_value: u8,
    up: Up,
    /// How long ago the last exchange every standby answered was sent.
    confirmed: Option<u8>,
    /// The exchange in flight (the region's lock is held): how long ago it was sent, and whether it is a write.
    exchanging: Option<(u8, bool)>,
    /// The standbys that answered the exchange in flight (a bit each).
    answered: u8,
    /// A write or exchange failed: a standby may lack the home's bytes.
    pending: bool,
    /// Exchanges started.
    seq: u8,
    taken_over: bool,
    // The standbys.
    copies: Vec<Copy>,
    /// Whether a standby claimed the takeover (the register every node agrees on: etcd).
    claimed: bool,
    // The world.
    net: Vec<Msg>,
    issued: u8,
    acknowledged: u8,
}

fn ticks(t: u8) -> Duration {
    Duration::from_millis(u64::from(t) * 100)
}

/// The protocol's safeguards, each of which a test turns off to see the model catch what it prevents.
#[derive(Debug, Clone, Copy)]
struct Checks {
    /// The home serves alone only while its standbys answered recently (`serves_alone`).
    fenced: bool,
    /// A standby takes no exchange older than one it took (a late delivery).
    ordered: bool,
    /// A standby takes over only if it claims the takeover first.
    claimed: bool,
}

const ALL_CHECKS: Checks = Checks { fenced: true, ordered: true, claimed: true };

/// The successors of `s`, or the violation found in a step.
fn next(s: &State, b: Bounds, Checks { fenced, ordered, claimed }: Checks) -> Result<Vec<State>, String> {
    let mut out = Vec::new();
    let dead_after = ticks(DEAD_AFTER);
    let all = (1u8 << b.standbys) - 1;
    // The clock ticks.
    let age = |t: u8| (t + 1).min(DEAD_AFTER);
    let mut n = s.clone();
    n.confirmed = s.confirmed.map(age);
    n.exchanging = s.exchanging.map(|(t, w)| (age(t), w));
    n.copies.iter_mut().for_each(|c| c.silent = age(c.silent));
    out.push(n);
    let room = s.net.len() + usize::from(b.standbys) <= b.in_flight && s.seq < b.exchanges;
    let home_free = s.up == Up::Running && !s.taken_over && s.exchanging.is_none();
    // An exchange of the home's: its bytes to every standby at once.
    let exchange = |value: u8, write: bool| {
        let mut n = s.clone();
        n.exchanging = Some((0, write));
        n.answered = 0;
        n.seq += 1;
        for to in 0..b.standbys {
            n.net.push(Msg::Replicate { to, value, seq: n.seq });
        }
        n
    };
    // The home writes the next value: applied here, then sent (a write takes the lock; check_home first).
    if home_free && s.issued < b.writes && room {
        let mut n = exchange(s.issued + 1, true);
        n.issued += 1;
        n.home_value = n.issued;
        out.push(n);
    }
    // The home probes its standbys (a read found them not fresh, or something pending): the region's bytes go.
    if home_free && room {
        out.push(exchange(s.home_value, false));
    }
    // A read at the home: served alone only while fresh and nothing is pending.
    let fresh = serves_alone(s.confirmed.map(ticks), dead_after) && !s.pending;
    if home_free && (fresh || !fenced) && s.home_value < s.acknowledged {
        return Err(format!("the home served {} after {} was acknowledged: {s:?}", s.home_value, s.acknowledged));
    }
    // A heartbeat to a standby.
    for to in 0..b.standbys {
        if s.up == Up::Running && s.net.len() < b.in_flight && !s.net.contains(&Msg::Ping { to }) {
            let mut n = s.clone();
            n.net.push(Msg::Ping { to });
            out.push(n);
        }
    }
    // An exchange that gets no answer times out: not acknowledged, and a standby may lack the bytes.
    if s.up == Up::Running && s.exchanging.is_some() {
        out.push(State { exchanging: None, pending: true, ..s.clone() });
    }
    // The home freezes, wakes, or crashes for good.
    match s.up {
        Up::Running => {
            out.push(State { up: Up::Frozen, ..s.clone() });
            out.push(State { up: Up::Crashed, ..s.clone() });
        }
        Up::Frozen => out.push(State { up: Up::Running, ..s.clone() }),
        Up::Crashed => {}
    }
    // Messages: each may be delivered (in any order, whenever) or lost.
    for i in 0..s.net.len() {
        let mut rest = s.clone();
        let m = rest.net.remove(i);
        out.push(rest.clone());
        match m {
            Msg::Replicate { to, value, seq } => {
                let mut n = rest;
                let c = &mut n.copies[usize::from(to)];
                c.silent = 0;
                if c.promoted {
                    n.net.push(Msg::Moved);
                } else if ordered && seq <= c.seq_taken {
                    // An exchange older than one it took (delivered late): refused, and the home is not
                    // waiting for it any more.
                } else {
                    c.seq_taken = seq;
                    c.value = value;
                    n.net.push(Msg::Ack { from: to, seq });
                }
                out.push(n);
            }
            Msg::Ping { to } => {
                let mut n = rest;
                n.copies[usize::from(to)].silent = 0;
                out.push(n);
            }
            Msg::Ack { from, seq } if s.up == Up::Running && seq == s.seq => {
                if let Some((sent, write)) = s.exchanging {
                    let mut n = rest;
                    n.answered |= 1 << from;
                    if n.answered == all {
                        n.exchanging = None;
                        n.pending = false;
                        n.confirmed = Some(sent);
                        if write {
                            n.acknowledged = n.acknowledged.max(n.home_value);
                        }
                    }
                    out.push(n);
                }
            }
            Msg::Moved if s.up == Up::Running => {
                out.push(State { taken_over: true, exchanging: None, ..rest });
            }
            // An answer to an exchange that timed out, or to a home that is not running: it waits or is lost.
            _ => {}
        }
    }
    for (i, c) in s.copies.iter().enumerate() {
        // A standby takes over once it has not heard from the home for `dead_after`, and claimed it first.
        if !c.promoted && may_take_over(ticks(c.silent), dead_after) && !(claimed && s.claimed) {
            if c.value < s.acknowledged {
                return Err(format!("standby {i} took over without write {}: {s:?}", s.acknowledged));
            }
            let mut n = s.clone();
            n.copies[i].promoted = true;
            n.claimed = true;
            out.push(n);
        }
        // Callers at a standby that took over: they write (acknowledged at once) and read.
        if c.promoted {
            if c.value < s.acknowledged {
                return Err(format!("standby {i} served {} after {} was acknowledged: {s:?}", c.value, s.acknowledged));
            }
            if s.issued < b.writes {
                let mut n = s.clone();
                n.issued += 1;
                n.copies[i].value = n.issued;
                n.acknowledged = n.issued;
                out.push(n);
            }
        }
    }
    Ok(out)
}

/// Explores every state reachable from the start; the first violation found, and how many states there were.
fn explore(b: Bounds, checks: Checks) -> (Option<String>, usize) {
    let copy = Copy { value: 0, silent: 0, promoted: false, seq_taken: 0 };
    let start = State {
        home_value: 0,
        up: Up::Running,
        confirmed: Some(0),
        exchanging: None,
        answered: 0,
        pending: false,
        seq: 0,
        taken_over: false,
        copies: vec![copy; usize::from(b.standbys)],
        claimed: false,
        net: Vec::new(),
        issued: 0,
        acknowledged: 0,
    };
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([start]);
    while let Some(s) = queue.pop_front() {
        if !seen.insert(s.clone()) {
            continue;
        }
        match next(&s, b, checks) {
            Ok(states) => {
                for mut n in states {
                    n.net.sort_unstable();
                    if !seen.contains(&n) {
                        queue.push_back(n);
                    }
                }
            }
            Err(why) => return (Some(why), seen.len()),
        }
    }
    (None, seen.len())
}

#[test]
fn no_acknowledged_write_is_lost_and_no_read_is_stale() {
    let (violation, states) = explore(ONE_STANDBY, ALL_CHECKS);
    eprintln!("replica protocol, one standby: {states} states explored");
    assert_eq!(violation, None);
    assert!(states > 10_000, "only {states} states: the model explores too little to mean anything");
}

#[test]
fn with_two_standbys_no_acknowledged_write_is_lost_and_no_read_is_stale() {
    let (violation, states) = explore(TWO_STANDBYS, ALL_CHECKS);
    eprintln!("replica protocol, two standbys: {states} states explored");
    assert_eq!(violation, None);
    assert!(states > 10_000, "only {states} states: the model explores too little to mean anything");
}

#[test]
fn without_fencing_the_model_finds_a_stale_read() {
    let (violation, _) = explore(ONE_STANDBY, Checks { fenced: false, ..ALL_CHECKS });
    let why = violation.expect("a home that serves whenever it is up must be caught serving a stale read");
    assert!(why.contains("the home served"), "{why}");
}

#[test]
fn without_ordering_the_model_finds_a_lost_write() {
    let (violation, _) = explore(ONE_STANDBY, Checks { ordered: false, ..ALL_CHECKS });
    let why = violation.expect("a standby that takes a late exchange over a newer one must be caught losing a write");
    assert!(why.contains("without write"), "{why}");
}

#[test]
fn without_a_claim_two_standbys_both_take_over_and_one_lacks_the_others_writes() {
    let (violation, _) = explore(TWO_STANDBYS, Checks { claimed: false, ..ALL_CHECKS });
    let why = violation.expect("two standbys that both take over must be caught losing a write or serving stale");
    // The second to take over lacks what callers wrote at the first: a lost write, or a stale read there.
    assert!(why.contains("took over without write") || why.contains("served"), "{why}");
}
