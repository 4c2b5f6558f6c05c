//! Where results go: a results folder with one JSON file and one Markdown file per run.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// `YYYY-MM-DD` and `YYYY-MM-DDTHH-MM-SSZ` for now (UTC), without a date library.
pub fn now_stamps() -> (String, String) {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let date = format!("{y:04}-{m:02}-{d:02}");
    let stamp = format!("{date}T{:02}-{:02}-{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60);
    (date, stamp)
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The version of the results' JSON layout: every scenario's document carries it (`schema_version`), with the
/// commit the harness was built from (`git_rev`) and the machine it ran on (`machine`). Raise it when a field
/// that readers use changes meaning or goes away.
pub const SCHEMA_VERSION: u32 = 1;

/// The machine a run is on, as its JSON says it: host name, cores, memory, kernel and CPU.
pub fn machine() -> serde_json::Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let meminfo = read("/proc/meminfo");
    let mem_kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|v| v.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_default();
    serde_json::json!({
        "host": read("/proc/sys/kernel/hostname").trim(),
        "cores": std::thread::available_parallelism().map_or(0, usize::from),
        "memory_bytes": mem_kib * 1024,
        "kernel": read("/proc/sys/kernel/osrelease").trim(),
        "cpu": cpu,
    })
}

/// `json` with the run's provenance added at its top (when it is an object): [`SCHEMA_VERSION`], the commit and
/// the machine.
pub fn with_provenance(json: &serde_json::Value) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    out.insert("schema_version".into(), SCHEMA_VERSION.into());
    out.insert("git_rev".into(), env!("VFABRIC_GIT_REV").into());
    out.insert("machine".into(), machine());
    match json {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                out.entry(k.clone()).or_insert_with(|| v.clone());
            }
            serde_json::Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Writes `json` (with its provenance: [`with_provenance`]) and `markdown` as `<dir>/<name>.json` and
/// `<dir>/<name>.md`, creating `dir`.
pub fn write(dir: &Path, name: &str, json: &serde_json::Value, markdown: &str) -> std::io::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let j = dir.join(format!("{name}.json"));
    let m = dir.join(format!("{name}.md"));
    let text = serde_json::to_string_pretty(&with_provenance(json)).map_err(std::io::Error::other)?;
    std::fs::write(&j, text)?;
    std::fs::write(&m, markdown)?;
    Ok((j, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_carry_their_schema_commit_and_machine() {
        let doc = with_provenance(&serde_json::json!({"scenario": "pager", "git_rev": "a scenario's own"}));
        assert_eq!(doc["schema_version"], SCHEMA_VERSION);
        assert_eq!(doc["scenario"], "pager");
        assert_eq!(doc["git_rev"], env!("VFABRIC_GIT_REV"), "the build's commit wins");
        assert!(doc["git_rev"].as_str().is_some_and(|r| !r.is_empty()));
        assert!(doc["machine"]["cores"].as_u64().is_some_and(|c| c >= 1), "{doc}");
        assert!(doc["machine"]["memory_bytes"].as_u64().is_some_and(|m| m > 0), "{doc}");
    }

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
