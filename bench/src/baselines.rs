//! Baselines measured outside this binary in the same device run: PyTorch copies (`torch_ceilings.py`, which
//! writes `probe.json`) and NCCL send/recv (`nccl_baseline.py`, whose log lines say `nccl send/recv N B X GB/s`).

use std::collections::HashMap;
use std::path::Path;

use vfabric_transport::Location;

/// GB/s by (source, destination, bytes).
#[derive(Debug, Default, Clone)]
pub struct External {
    torch: HashMap<(Location, Location, u64), f64>,
    nccl: HashMap<u64, f64>,
}

fn torch_location(s: &str) -> Option<Location> {
    match s {
        "cpu" => Some(Location::Host),
        _ => s.strip_prefix("cuda:").and_then(|n| n.parse().ok()).map(Location::Gpu),
    }
}

impl External {
    /// Reads whichever of the two files exist; a missing or unreadable file leaves its baseline out (and says
    /// so on stderr) rather than failing the benchmark.
    pub fn load(torch_json: Option<&Path>, nccl_log: Option<&Path>) -> External {
        let mut ext = External::default();
        if let Some(p) = torch_json {
            match std::fs::read_to_string(p)
                .map_err(|e| e.to_string())
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string()))
            {
                Ok(v) => {
                    for row in v.get("copies").and_then(|c| c.as_array()).into_iter().flatten() {
                        let r = row.as_array();
                        let field = |i: usize| r.and_then(|r| r.get(i));
                        if let (Some(s), Some(d), Some(n), Some(g)) = (
                            field(0).and_then(|x| x.as_str()).and_then(torch_location),
                            field(1).and_then(|x| x.as_str()).and_then(torch_location),
                            field(2).and_then(|x| x.as_u64()),
                            field(3).and_then(|x| x.as_f64()),
                        ) {
                            ext.torch.insert((s, d, n), g);
                        }
                    }
                }
                Err(e) => eprintln!("torch baseline {} not used: {e}", p.display()),
            }
        }
        if let Some(p) = nccl_log {
            match std::fs::read_to_string(p) {
                Ok(t) => {
                    for line in t.lines() {
                        let w: Vec<&str> = line.split_whitespace().collect();
                        // nccl send/recv <bytes> B <GB/s> GB/s <us> us
                        if w.len() >= 5 && w[0] == "nccl" && w[1] == "send/recv" {
                            if let (Ok(n), Ok(g)) = (w[2].parse::<u64>(), w[4].parse::<f64>()) {
                                ext.nccl.insert(n, g);
                            }
                        }
                    }
                }
                Err(e) => eprintln!("NCCL baseline {} not used: {e}", p.display()),
            }
        }
        ext
    }

    /// PyTorch's copy of `bytes` from `from` to `to`, if measured.
    pub fn torch(&self, from: Location, to: Location, bytes: u64) -> Option<f64> {
        self.torch.get(&(from, to, bytes)).copied()
    }

    /// NCCL send/recv GPU 0 -> GPU 1 of `bytes`, if measured.
    pub fn nccl(&self, bytes: u64) -> Option<f64> {
        self.nccl.get(&bytes).copied()
    }

    /// Whether anything was loaded.
    pub fn is_empty(&self) -> bool {
        self.torch.is_empty() && self.nccl.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_formats() {
        let dir = std::env::temp_dir().join(format!("vfb-ext-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let j = dir.join("probe.json");
        std::fs::write(&j, r#"{"copies": [["cuda:0", "cuda:1", 1073741824, 385.1, 2788.0], ["cpu", "cuda:0", 1073741824, 55.2, 1.0]]}"#).unwrap();
        let n = dir.join("nccl.log");
        std::fs::write(&n, "nccl send/recv  1073741824 B   368.00 GB/s    2917.0 us\nother line\n").unwrap();
        let e = External::load(Some(&j), Some(&n));
        assert_eq!(e.torch(Location::Gpu(0), Location::Gpu(1), 1 << 30), Some(385.1));
        assert_eq!(e.torch(Location::Host, Location::Gpu(0), 1 << 30), Some(55.2));
        assert_eq!(e.nccl(1 << 30), Some(368.0));
        assert!(External::load(Some(&dir.join("missing.json")), None).is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
