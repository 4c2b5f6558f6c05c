//! Summaries of repeated timings.

use serde::Serialize;

/// The spread of a set of timings, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Summary {
    /// Number of samples.
    pub n: usize,
    /// Median.
    pub median: f64,
    /// Fastest.
    pub min: f64,
    /// Slowest.
    pub max: f64,
}

impl Summary {
    /// Summarises `samples`; `None` when there are none.
    pub fn of(samples: &[f64]) -> Option<Summary> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Some(Summary { n, median, min: v[0], max: v[n - 1] })
    }

    /// `bytes` over the median time, in GB/s (10^9 bytes per second).
    pub fn gb_per_s(&self, bytes: u64) -> f64 {
        if self.median > 0.0 {
            bytes as f64 / self.median / 1e9
        } else {
            0.0
        }
    }
}

/// The `p`-quantile (0..=1) of `samples`, which it sorts; 0 when there are none.
pub fn percentile(samples: &mut [f64], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[((samples.len() - 1) as f64 * p.clamp(0.0, 1.0)).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even() {
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]).map(|s| s.median), Some(2.0));
        assert_eq!(Summary::of(&[4.0, 1.0, 2.0, 3.0]).map(|s| (s.median, s.min, s.max)), Some((2.5, 1.0, 4.0)));
        assert!(Summary::of(&[]).is_none());
        assert_eq!(Summary::of(&[0.5]).map(|s| s.gb_per_s(1_000_000_000)), Some(2.0));
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!((percentile(&mut v, 0.5), percentile(&mut v, 0.99), percentile(&mut [], 0.5)), (51.0, 99.0, 0.0));
    }
}
