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

/// Writes `json` and `markdown` as `<dir>/<name>.json` and `<dir>/<name>.md`, creating `dir`.
pub fn write(dir: &Path, name: &str, json: &serde_json::Value, markdown: &str) -> std::io::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let j = dir.join(format!("{name}.json"));
    let m = dir.join(format!("{name}.md"));
    let text = serde_json::to_string_pretty(json).map_err(std::io::Error::other)?;
    std::fs::write(&j, text)?;
    std::fs::write(&m, markdown)?;
    Ok((j, m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }
}
