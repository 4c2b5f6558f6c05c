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
//! Two more tests turn a safeguard off each and check that the model then finds what it prevents: a home that
//! serves whenever it is up serves a stale read; a standby that takes an exchange delivered late, over a newer
//! one, loses an acknowledged write. The checks can fail.

use std::collections::{HashSet, VecDeque};
use std::time::Duration;

use vfabric::agent::{may_take_over, serves_alone};

/// `dead_after`, in ticks. Times are kept as ages capped at it (the rules only compare them with it and its
/// half), so the model covers any length of time.
const DEAD_AFTER: u8 = 2;
/// Writes issued in all (values 1..=WRITES; a later write has a larger value).
const WRITES: u8 = 3;
/// Messages in flight at once.
const IN_FLIGHT: usize = 3;
/// Exchanges the home starts in all (writes and probes).
const EXCHANGES: u8 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Msg {
    /// The home's bytes (a write's, or the whole region's on a probe after a lost exchange), as the home's
    /// exchange `seq`.
    Replicate { value: u8, seq: u8 },
    /// The standby took exchange `seq`.
    Ack { seq: u8 },
    /// The standby had taken over.
    Moved,
    /// A heartbeat from the home.
    Ping,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Up {
    Running,
    Frozen,
    Crashed,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    // The home.
    home_value: u8,
    up: Up,
    /// How long ago the last exchange the standby answered was sent.
    confirmed: Option<u8>,
    /// The exchange in flight (the region's lock is held): how long ago it was sent, and whether it is a write.
    exchanging: Option<(u8, bool)>,
    /// A write or exchange failed: the standby may lack the home's bytes.
    pending: bool,
    /// Exchanges started.
    seq: u8,
    taken_over: bool,
    // The standby.
    copy_value: u8,
    /// How long since it last heard from the home.
    silent: u8,
    promoted: bool,
    /// The last exchange it took.
    seq_taken: u8,
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
    /// The home serves alone only while its standby answered recently (`serves_alone`).
    fenced: bool,
    /// A standby takes no exchange older than one it took (a late delivery).
    ordered: bool,
}

/// The successors of `s`, or the violation found in a step.
fn next(s: &State, Checks { fenced, ordered }: Checks) -> Result<Vec<State>, String> {
    let mut out = Vec::new();
    let dead_after = ticks(DEAD_AFTER);
    // The clock ticks.
    let age = |t: u8| (t + 1).min(DEAD_AFTER);
    out.push(State {
        confirmed: s.confirmed.map(age),
        exchanging: s.exchanging.map(|(t, w)| (age(t), w)),
        silent: age(s.silent),
        ..s.clone()
    });
    let room = s.net.len() < IN_FLIGHT && s.seq < EXCHANGES;
    let home_free = s.up == Up::Running && !s.taken_over && s.exchanging.is_none();
    // The home writes the next value: applied here, then sent (a write takes the lock; check_home first).
    if home_free && s.issued < WRITES && room {
        let mut n = s.clone();
        n.issued += 1;
        n.home_value = n.issued;
        n.exchanging = Some((0, true));
        n.seq += 1;
        n.net.push(Msg::Replicate { value: n.issued, seq: n.seq });
        out.push(n);
    }
    // The home probes its standby (a read found it not fresh, or something pending): the region's bytes go.
    if home_free && room {
        let mut n = s.clone();
        n.exchanging = Some((0, false));
        n.seq += 1;
        n.net.push(Msg::Replicate { value: s.home_value, seq: n.seq });
        out.push(n);
    }
    // A read at the home: served alone only while fresh and nothing is pending.
    let fresh = serves_alone(s.confirmed.map(ticks), dead_after) && !s.pending;
    if home_free && (fresh || !fenced) && s.home_value < s.acknowledged {
        return Err(format!("the home served {} after {} was acknowledged: {s:?}", s.home_value, s.acknowledged));
    }
    // A heartbeat.
    if s.up == Up::Running && s.net.len() < IN_FLIGHT && !s.net.contains(&Msg::Ping) {
        let mut n = s.clone();
        n.net.push(Msg::Ping);
        out.push(n);
    }
    // An exchange that gets no answer times out: not acknowledged, and the standby may lack the bytes.
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
            Msg::Replicate { value, seq } => {
                let mut n = rest;
                n.silent = 0;
                if n.promoted {
                    n.net.push(Msg::Moved);
                } else if ordered && seq <= n.seq_taken {
                    // An exchange older than one it took (delivered late): refused, and the home is not
                    // waiting for it any more.
                } else {
                    n.seq_taken = seq;
                    n.copy_value = value;
                    n.net.push(Msg::Ack { seq });
                }
                out.push(n);
            }
            Msg::Ping => out.push(State { silent: 0, ..rest }),
            Msg::Ack { seq } if s.up == Up::Running && seq == s.seq => {
                if let Some((sent, write)) = s.exchanging {
                    let mut n = rest;
                    n.exchanging = None;
                    n.pending = false;
                    n.confirmed = Some(sent);
                    if write {
                        n.acknowledged = n.acknowledged.max(n.home_value);
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
    // The standby takes over once it has not heard from the home for `dead_after`.
    if !s.promoted && may_take_over(ticks(s.silent), dead_after) {
        if s.copy_value < s.acknowledged {
            return Err(format!("the standby took over without write {}: {s:?}", s.acknowledged));
        }
        out.push(State { promoted: true, ..s.clone() });
    }
    // Callers at the standby that took over: they write (acknowledged at once) and read.
    if s.promoted {
        if s.copy_value < s.acknowledged {
            return Err(format!(
                "the standby served {} after {} was acknowledged: {s:?}",
                s.copy_value, s.acknowledged
            ));
        }
        if s.issued < WRITES {
            let mut n = s.clone();
            n.issued += 1;
            n.copy_value = n.issued;
            n.acknowledged = n.issued;
            out.push(n);
        }
    }
    Ok(out)
}

/// Explores every state reachable from the start; the first violation found, and how many states there were.
fn explore(checks: Checks) -> (Option<String>, usize) {
    let start = State {
        home_value: 0,
        up: Up::Running,
        confirmed: Some(0),
        exchanging: None,
        pending: false,
        seq: 0,
        taken_over: false,
        copy_value: 0,
        silent: 0,
        promoted: false,
        seq_taken: 0,
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
        match next(&s, checks) {
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
    let (violation, states) = explore(Checks { fenced: true, ordered: true });
    eprintln!("replica protocol: {states} states explored");
    assert_eq!(violation, None);
    assert!(states > 10_000, "only {states} states: the model explores too little to mean anything");
}

#[test]
fn without_fencing_the_model_finds_a_stale_read() {
    let (violation, _) = explore(Checks { fenced: false, ordered: true });
    let why = violation.expect("a home that serves whenever it is up must be caught serving a stale read");
    assert!(why.contains("the home served"), "{why}");
}

#[test]
fn without_ordering_the_model_finds_a_lost_write() {
    let (violation, _) = explore(Checks { fenced: true, ordered: false });
    let why = violation.expect("a standby that takes a late exchange over a newer one must be caught losing a write");
    assert!(why.contains("without write"), "{why}");
}
