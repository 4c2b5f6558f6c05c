//! What the QUIC connections to one peer have done: packets, losses, congestion and flow-control stalls.
//!
//! A transfer that runs below the wire's speed is slow for one of a few reasons, and quinn counts each of them:
//! packets lost (the socket buffer overflowed, or the path dropped them) and the congestion window cut after
//! it, or a sender that ran out of flow-control credit (the receiver did not read fast enough). [`LinkStats`]
//! sums those counters over a peer's lanes, so that `vfabric-bench remote` can report them beside each figure.

use std::time::Duration;

/// Counters of the QUIC connections (lanes) between this node and one peer, summed over the open lanes; each
/// counts from the moment its connection was dialled or accepted. [`LinkStats::since`] gives what a period
/// added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Lanes with an open connection.
    pub lanes_open: usize,
    /// QUIC packets sent.
    pub sent_packets: u64,
    /// Packets declared lost (and resent) by this end.
    pub lost_packets: u64,
    /// Bytes in those packets.
    pub lost_bytes: u64,
    /// Times this end cut its congestion window.
    pub congestion_events: u64,
    /// UDP payload bytes sent and received.
    pub udp_tx_bytes: u64,
    /// UDP payload bytes received.
    pub udp_rx_bytes: u64,
    /// Send system calls (one may carry several packets through segmentation offload).
    pub udp_tx_calls: u64,
    /// Frames this end sent saying it was out of connection or stream flow-control credit.
    pub blocked_frames_sent: u64,
    /// The same, received from the peer: the peer waited for this end to read.
    pub blocked_frames_received: u64,
    /// The largest smoothed round-trip time among the lanes.
    pub rtt: Duration,
}

impl LinkStats {
    /// Adds one connection's counters (quinn's own) to these.
    pub(super) fn add(&mut self, s: &quinn::ConnectionStats) {
        self.lanes_open += 1;
        self.sent_packets += s.path.sent_packets;
        self.lost_packets += s.path.lost_packets;
        self.lost_bytes += s.path.lost_bytes;
        self.congestion_events += s.path.congestion_events;
        self.udp_tx_bytes += s.udp_tx.bytes;
        self.udp_rx_bytes += s.udp_rx.bytes;
        self.udp_tx_calls += s.udp_tx.ios;
        self.blocked_frames_sent += s.frame_tx.data_blocked + s.frame_tx.stream_data_blocked;
        self.blocked_frames_received += s.frame_rx.data_blocked + s.frame_rx.stream_data_blocked;
        self.rtt = self.rtt.max(s.path.rtt);
    }

    /// What happened between `earlier` and these counters (each counter's difference, saturating at zero where
    /// a lane was re-dialled in between; `lanes_open` and `rtt` are these).
    pub fn since(&self, earlier: &LinkStats) -> LinkStats {
        LinkStats {
            lanes_open: self.lanes_open,
            sent_packets: self.sent_packets.saturating_sub(earlier.sent_packets),
            lost_packets: self.lost_packets.saturating_sub(earlier.lost_packets),
            lost_bytes: self.lost_bytes.saturating_sub(earlier.lost_bytes),
            congestion_events: self.congestion_events.saturating_sub(earlier.congestion_events),
            udp_tx_bytes: self.udp_tx_bytes.saturating_sub(earlier.udp_tx_bytes),
            udp_rx_bytes: self.udp_rx_bytes.saturating_sub(earlier.udp_rx_bytes),
            udp_tx_calls: self.udp_tx_calls.saturating_sub(earlier.udp_tx_calls),
            blocked_frames_sent: self.blocked_frames_sent.saturating_sub(earlier.blocked_frames_sent),
            blocked_frames_received: self.blocked_frames_received.saturating_sub(earlier.blocked_frames_received),
            rtt: self.rtt,
        }
    }

    /// The share of sent packets that were lost, 0 when none were sent.
    pub fn loss_ratio(&self) -> f64 {
        if self.sent_packets == 0 {
            0.0
        } else {
            self.lost_packets as f64 / self.sent_packets as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_subtracts_counters_and_keeps_the_current_state() {
        let earlier = LinkStats {
            lanes_open: 1,
            sent_packets: 10,
            lost_packets: 1,
            rtt: Duration::from_micros(50),
            ..Default::default()
        };
        let now = LinkStats {
            lanes_open: 2,
            sent_packets: 110,
            lost_packets: 6,
            rtt: Duration::from_micros(80),
            ..Default::default()
        };
        let d = now.since(&earlier);
        assert_eq!((d.lanes_open, d.sent_packets, d.lost_packets, d.rtt), (2, 100, 5, Duration::from_micros(80)));
        assert!((d.loss_ratio() - 0.05).abs() < 1e-12);
        // A lane dialled again in between starts from zero: no underflow.
        assert_eq!(earlier.since(&now).sent_packets, 0);
        assert_eq!(LinkStats::default().loss_ratio(), 0.0);
    }
}
