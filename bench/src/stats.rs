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

/// The latency distribution's curve: `samples` (which it sorts) at every hundredth of their mass, from the
/// fastest (0) to the slowest (1), 101 values; empty when there are none.
pub fn cdf(samples: &mut [f64]) -> Vec<f64> {
    if samples.is_empty() {
        return Vec::new();
    }
    (0..=100).map(|i| percentile(samples, f64::from(i) / 100.0)).collect()
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
        let curve = cdf(&mut v);
        assert_eq!((curve.len(), curve[0], curve[50], curve[100]), (101, 1.0, 51.0, 100.0));
        assert!(curve.windows(2).all(|w| w[0] <= w[1]), "rises");
        assert!(cdf(&mut []).is_empty());
    }
}
