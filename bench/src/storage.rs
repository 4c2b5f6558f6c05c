//! `vfabric-bench storage`: the storage tier's file I/O (io_uring, O_DIRECT, every page checksummed) writing and
//! reading a file of pages, beside fio doing the same with O_DIRECT and io_uring on the same path, at the same
//! queue depth and block size, in the same run; the tier's cost of LZ4 and zstd on incompressible pages and
//! their gain on compressible ones; a trained model's tensors written and read through the tier with none, LZ4
//! and zstd in turn (GB/s against the uncompressed tier of the same round, and the bytes the file takes); and the
//! compression figures of `compression`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use serde_json::json;
use vfabric::pattern::shuffled;
use vfabric::ByteSize;
use vfabric_transport::storage::{AlignedBuffer, Compression, StorageFile, StorageSpec};

use crate::compression::{self, CodecRow};
use crate::report;
use crate::storage_gpu::{self, GpuRow};

/// Options of `vfabric-bench storage`.
#[derive(Args, Debug, Clone)]
pub struct StorageArgs {
    /// Folder the file goes in: on the drive to measure (O_DIRECT needs a disk's filesystem, not tmpfs).
    #[arg(long, default_value = "bench/out")]
    pub dir: PathBuf,
    /// Size of the file.
    #[arg(long, default_value = "1GiB")]
    pub size: ByteSize,
    /// Page size (the block size of every request).
    #[arg(long, default_value = "2MiB")]
    pub page_size: ByteSize,
    /// Requests in flight (each measured).
    #[arg(long, value_delimiter = ',', default_values = ["4", "32"])]
    pub depth: Vec<u32>,
    /// Pages a call hands the tier (as an eviction stage does).
    #[arg(long, default_value_t = 64)]
    pub batch: u64,
    /// Callers handing the tier calls at once (1, 2 or 4; the fabric's evictions and prefetch windows run
    /// beside each other), sharing the depth: each keeps `depth / callers` requests in flight, so the tier
    /// never has more in flight than fio.
    #[arg(long, default_value_t = 2)]
    pub callers: u32,
    /// The fio to run beside it.
    #[arg(long, default_value = "fio")]
    pub fio: PathBuf,
    /// A folder of raw tensors (one per file) to measure compression on, beside the synthetic ones.
    #[arg(long)]
    pub tensors: Option<PathBuf>,
    /// With `--tensors`: the file each pass of a trained tensor's pages through the tier writes and reads.
    #[arg(long, default_value = "1GiB")]
    pub tensor_size: ByteSize,
    /// With `--tensors`: rounds of their passes through the tier at the deepest depth. Each round writes and
    /// reads each kind with no compression, LZ4 and zstd back to back (each round starting with the next), so a
    /// noisy disk weighs on all three alike; the medians are reported.
    #[arg(long, default_value_t = 3)]
    pub tensor_runs: usize,
    /// Also read the file's pages on to GPU 0 at the deepest depth (through host memory, and straight on as each
    /// page arrives), beside the tier's reads into host memory (the emulated device where there is no GPU).
    #[arg(long)]
    pub to_gpu: bool,
    /// Bytes of each kind of data the compression figures use.
    #[arg(long, default_value = "256MiB")]
    pub codec_sample: ByteSize,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: storage-TIME).
    #[arg(long)]
    pub name: Option<String>,
}

/// One pass over the file.
#[derive(Debug, Clone, Serialize)]
pub struct IoRow {
    /// "vfabric" (the tier) or "fio".
    pub engine: &'static str,
    /// "write", "read" (in order) or "randread".
    pub op: &'static str,
    /// The pages' data: "random", "sparse", or a trained tensor's name (or "all tensors").
    pub data: String,
    /// "none", "lz4" or "zstd".
    pub compression: String,
    /// Requests in flight.
    pub depth: u32,
    /// Callers at once (the tier's; fio runs one job).
    pub callers: u32,
    /// Page bytes moved.
    pub bytes: u64,
    /// Seconds.
    pub seconds: f64,
    /// Page bytes per second, GB/s.
    pub gb_s: f64,
    /// For the tier's writes: the file bytes its pages took over their page bytes.
    pub stored_share: Option<f64>,
}

fn row(engine: &'static str, op: &'static str, data: &str, c: Compression, depth: u32, bytes: u64, secs: f64) -> IoRow {
    IoRow {
        engine,
        op,
        data: data.to_owned(),
        compression: c.to_string(),
        depth,
        callers: 1,
        bytes,
        seconds: secs,
        gb_s: bytes as f64 / secs.max(1e-9) / 1e9,
        stored_share: None,
    }
}

/// Every pass over the file: in order, then read in order, then at random.
const ALL_OPS: &[&str] = &["write", "read", "randread"];

/// The codecs of the trained tensors' passes, the baseline first.
const TIER_CODECS: [Compression; 3] = [Compression::None, Compression::Lz4, Compression::Zstd];

/// A kind of trained data written and read through the tier with one codec, once a round.
#[derive(Debug, Clone, Serialize)]
pub struct TensorIoRow {
    /// A tensor's file name, or "all tensors" (a page of each in turn).
    pub data: String,
    /// "none", "lz4" or "zstd".
    pub compression: String,
    /// Page bytes written, then read, each round.
    pub bytes: u64,
    /// GB/s of page bytes of each round's write, in order.
    pub write_gb_s: Vec<f64>,
    /// GB/s of page bytes of each round's read (in order, every page checked), in order.
    pub read_gb_s: Vec<f64>,
    /// The median over the rounds of the write's GB/s over the uncompressed tier's write of the same round.
    pub write_vs_none: f64,
    /// The same of the reads.
    pub read_vs_none: f64,
    /// File bytes over page bytes once written.
    pub stored_share: f64,
}

/// The median of `v` (the mean of the middle two for an even count; 0 for none).
fn median(v: &[f64]) -> f64 {
    crate::stats::Summary::of(v).map_or(0.0, |s| s.median)
}

/// The trained tensors' fills of at most `max_pages` pages of `ps`: each tensor with a whole page, then, with two
/// or more, "all tensors": a page of each in turn (a shorter one starting again), as many pages as they hold.
pub(crate) fn tensor_fills(trained: &[(String, Vec<u8>)], ps: usize, max_pages: usize) -> Vec<(String, Vec<u8>)> {
    let kinds: Vec<(&str, &[u8])> = trained
        .iter()
        .map(|(n, d)| (n.as_str(), &d[..(d.len() / ps).min(max_pages) * ps]))
        .filter(|(_, d)| !d.is_empty())
        .collect();
    let mut fills: Vec<(String, Vec<u8>)> = kinds.iter().map(|&(n, d)| (n.to_owned(), d.to_vec())).collect();
    if kinds.len() > 1 {
        let total = kinds.iter().map(|(_, d)| d.len() / ps).sum::<usize>().min(max_pages);
        let mut all = Vec::with_capacity(total * ps);
        for k in 0..total {
            let d = kinds[k % kinds.len()].1;
            let p = (k / kinds.len()) % (d.len() / ps);
            all.extend_from_slice(&d[p * ps..(p + 1) * ps]);
        }
        fills.push(("all tensors".to_owned(), all));
    }
    fills
}

/// Each fill written and read through the tier, a file of `--tensor-size`, `--tensor-runs` rounds of the three
/// codecs in turn at `depth`.
fn tensor_io(
    args: &StorageArgs,
    path: &Path,
    depth: u32,
    fills: &[(String, Vec<u8>)],
) -> Result<Vec<TensorIoRow>, String> {
    let ps = args.page_size.bytes();
    let size = args.tensor_size.bytes() / ps * ps;
    let mut out = Vec::new();
    for (data, pages) in fills {
        // Per codec: each round's (write, read) GB/s, and the file bytes over page bytes.
        let mut runs: [Vec<(f64, f64)>; 3] = Default::default();
        let mut share = [1.0; 3];
        for round in 0..args.tensor_runs {
            for k in 0..TIER_CODECS.len() {
                let i = (round + k) % TIER_CODECS.len();
                let c = TIER_CODECS[i];
                eprintln!("{data}, round {}: {} through the tier with {c}", round + 1, ByteSize(size));
                let fill = Fill { data, pages };
                let rows = tier_passes(args, (path, size), depth, &fill, &["write", "read"], c)?;
                runs[i].push((rows[0].gb_s, rows[1].gb_s));
                share[i] = rows[0].stored_share.unwrap_or(1.0);
            }
        }
        for (i, c) in TIER_CODECS.iter().enumerate() {
            let vs = |pick: fn(&(f64, f64)) -> f64| {
                let ratios: Vec<f64> = runs[i].iter().zip(&runs[0]).map(|(r, n)| pick(r) / pick(n)).collect();
                median(&ratios)
            };
            out.push(TensorIoRow {
                data: data.clone(),
                compression: c.to_string(),
                bytes: size,
                write_gb_s: runs[i].iter().map(|r| r.0).collect(),
                read_gb_s: runs[i].iter().map(|r| r.1).collect(),
                write_vs_none: vs(|r| r.0),
                read_vs_none: vs(|r| r.1),
                stored_share: share[i],
            });
        }
    }
    Ok(out)
}

/// The tensors' table.
fn tensor_markdown(md: &mut String, args: &StorageArgs, depth: u32, rows: &[TensorIoRow]) {
    let _ = writeln!(
        md,
        "
## Trained tensors through the tier
"
    );
    let _ = writeln!(
        md,
        "- each kind (its first {} of pages, again and again; and all of them, a page of each in turn) written to a \
         file of {} and read back in order, depth {depth}, pages of {}, {} callers; {} rounds, each writing and \
         reading with none, LZ4 and zstd back to back (each round starting with the next codec); GB/s of page \
         bytes, medians of the rounds; x none: the median of each round's GB/s over the uncompressed tier's in the \
         same round; every page read back checked\n",
        ByteSize(args.codec_sample.bytes().min(args.tensor_size.bytes())),
        args.tensor_size,
        args.page_size,
        args.callers,
        args.tensor_runs
    );
    let head =
        "| data | compression | write GB/s | x none | read GB/s | x none | file bytes / page bytes | page bytes / \
                file bytes |";
    let _ = writeln!(md, "{head}");
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.3} | {:.2} |",
            r.data,
            r.compression,
            median(&r.write_gb_s),
            r.write_vs_none,
            median(&r.read_gb_s),
            r.read_vs_none,
            r.stored_share,
            1.0 / r.stored_share.max(1e-9)
        );
    }
}

/// What a pass writes: slot s of the file holds page s % (its pages) of `fill`.
pub(crate) struct Fill<'a> {
    /// What the pages hold, for the report.
    pub data: &'a str,
    /// Whole pages.
    pub pages: &'a [u8],
}

/// The synthetic fill of `data` ("random" or "sparse"): a call's worth of pages.
fn synthetic_fill(data: &str, bytes: usize) -> Vec<u8> {
    let kind = if data == "sparse" { "sparse: zeros, a number every 4 KiB" } else { "random bytes" };
    compression::synthetic(kind, bytes, 7)
}

/// The tier writing every slot of a file of `size` bytes in order, then each of the other `ops` ("read": in
/// order, "randread": in a random order), `batch` pages a call, the calls dealt round-robin to `args.callers`
/// threads sharing the depth; the file is removed at the end. Every read is checked by the tier; the bytes are
/// compared here too.
pub(crate) fn tier_passes(
    args: &StorageArgs,
    (path, size): (&Path, u64),
    depth: u32,
    fill: &Fill,
    ops: &[&'static str],
    c: Compression,
) -> Result<Vec<IoRow>, String> {
    let ps = args.page_size.bytes();
    let slots = size / ps;
    let batch = args.batch.clamp(1, slots.max(1));
    let callers = args.callers.max(1);
    let per_caller = (depth / callers).max(1);
    if fill.pages.is_empty() || fill.pages.len() as u64 % ps != 0 {
        return Err(format!("{}: no whole pages of {} to write", fill.data, args.page_size));
    }
    let tier = StorageFile::create(&StorageSpec {
        path: path.to_owned(),
        bytes: slots * ps,
        page_size: ps,
        depth: per_caller,
    })
    .map_err(|e| e.to_string())?;
    // O_DIRECT writes pages from aligned memory: one copy of the fill, shared by the callers.
    let mut src = AlignedBuffer::new(fill.pages.len()).ok_or("no memory for the pages")?;
    src.copy_from_slice(fill.pages);
    let src: &[u8] = &src;
    let sequential: Vec<u64> = (0..slots).collect();
    let random: Vec<u64> = shuffled(slots as u32, 0x5EED).into_iter().map(u64::from).collect();
    let mut rows = Vec::new();
    for op in std::iter::once("write").chain(ops.iter().copied().filter(|&o| o != "write")) {
        let order = if op == "randread" { &random } else { &sequential };
        let calls: Vec<&[u64]> = order.chunks(batch as usize).collect();
        let t = Instant::now();
        let bad: u64 = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..callers as usize)
                .map(|w| {
                    let (tier, calls) = (&tier, &calls);
                    let mine = calls.iter().skip(w).step_by(callers as usize);
                    scope.spawn(move || caller(tier, op, (src, batch as usize), mine, ps, c))
                })
                .collect();
            workers
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a caller panicked".into())))
                .sum::<Result<u64, String>>()
        })?;
        let secs = t.elapsed().as_secs_f64();
        if bad > 0 {
            return Err(format!("{bad} pages read back from the tier differ from what was written"));
        }
        let mut r = row("vfabric", op, fill.data, c, depth, slots * ps, secs);
        r.callers = callers;
        if op == "write" {
            let (file_bytes, _) = tier.stored();
            r.stored_share = Some(file_bytes as f64 / (slots * ps) as f64);
        }
        rows.push(r);
    }
    Ok(rows)
}

/// One caller's share of a pass: its calls in turn, from the shared aligned `src` and into a buffer of its own
/// of `batch` pages. Slot s holds page s % (the pages of `src`). Returns the pages read back wrong.
fn caller<'a>(
    tier: &StorageFile,
    op: &str,
    (src, batch): (&[u8], usize),
    calls: impl Iterator<Item = &'a &'a [u64]>,
    ps: u64,
    c: Compression,
) -> Result<u64, String> {
    let ps_us = ps as usize;
    let src_pages = (src.len() / ps_us) as u64;
    let mut dst = AlignedBuffer::new(batch * ps_us).ok_or("no memory for the pages")?;
    let page = |s: u64| &src[(s % src_pages) as usize * ps_us..][..ps_us];
    let mut bad = 0;
    for call in calls {
        if op == "write" {
            let pages: Vec<(u64, &[u8])> = call.iter().map(|&s| (s, page(s))).collect();
            tier.write(&pages, c).map_err(|e| e.to_string())?;
            continue;
        }
        let mut pages: Vec<(u64, &mut [u8])> = call.iter().copied().zip(dst.chunks_mut(ps_us)).collect();
        tier.read(&mut pages).map_err(|e| e.to_string())?;
        bad += call.iter().zip(dst.chunks(ps_us)).filter(|&(&s, got)| got != page(s)).count() as u64;
    }
    Ok(bad)
}

/// fio over the same path: write in order, read in order, random read, each its own job; the file removed.
fn fio_passes(args: &StorageArgs, path: &Path, depth: u32) -> Result<Vec<IoRow>, String> {
    let mut rows = Vec::new();
    for (op, rw) in [("write", "write"), ("read", "read"), ("randread", "randread")] {
        let out = Command::new(&args.fio)
            .args([
                "--name=vfabric-baseline",
                &format!("--filename={}", path.display()),
                &format!("--size={}", args.size.bytes() / args.page_size.bytes() * args.page_size.bytes()),
                &format!("--bs={}", args.page_size.bytes()),
                &format!("--rw={rw}"),
                "--direct=1",
                "--ioengine=io_uring",
                &format!("--iodepth={depth}"),
                "--output-format=json",
            ])
            .output()
            .map_err(|e| format!("running {}: {e} (install fio, or pass --fio PATH)", args.fio.display()))?;
        if !out.status.success() {
            return Err(format!("fio {rw} failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("fio's JSON: {e}"))?;
        let job = &doc["jobs"][0][if op == "write" { "write" } else { "read" }];
        let (bytes, ms) = (job["io_bytes"].as_u64().unwrap_or(0), job["runtime"].as_u64().unwrap_or(0));
        if bytes == 0 || ms == 0 {
            return Err(format!("fio {rw} reported no I/O"));
        }
        rows.push(row("fio", op, "random", Compression::None, depth, bytes, ms as f64 / 1e3));
    }
    let _ = std::fs::remove_file(path);
    Ok(rows)
}

/// Runs `vfabric-bench storage`.
pub fn run(args: &StorageArgs, command_line: &str) -> Result<(), String> {
    let ps = args.page_size.bytes();
    if ps == 0 || ps % 4096 != 0 || args.size.bytes() < ps {
        return Err(format!("--page-size must be a multiple of 4 KiB no larger than --size (got {})", args.page_size));
    }
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let path = args.dir.join("vfabric-storage-bench.tier");
    let _ = std::fs::remove_file(&path);
    let mut io = Vec::new();
    if ![1, 2, 4].contains(&args.callers) {
        return Err(format!("--callers {}: 1, 2 or 4", args.callers));
    }
    if let Some(d) = args.depth.iter().find(|&&d| d < args.callers || !d.is_power_of_two()) {
        return Err(format!("--depth {d}: a power of two, at least --callers ({})", args.callers));
    }
    if args.tensor_runs == 0 || args.tensor_size.bytes() < ps {
        return Err(format!("--tensor-runs must be at least 1 and --tensor-size at least a page ({})", args.page_size));
    }
    let (size, sample) = (args.size.bytes(), args.codec_sample.bytes() as usize);
    let batch = args.batch.clamp(1, size / ps);
    // Read first: a wrong folder fails before the long passes.
    let trained = match &args.tensors {
        Some(dir) => compression::tensors(dir, sample)?,
        None => Vec::new(),
    };
    for &depth in &args.depth {
        eprintln!("depth {depth}: the tier, then fio, over {} of {} pages", args.size, args.page_size);
        let fill = synthetic_fill("random", (batch * ps) as usize);
        let fill = Fill { data: "random", pages: &fill };
        io.extend(tier_passes(args, (&path, size), depth, &fill, ALL_OPS, Compression::None)?);
        io.extend(fio_passes(args, &path, depth)?);
    }
    let deepest = args.depth.iter().copied().max().unwrap_or(32);
    eprintln!("depth {deepest}: the tier with LZ4 and zstd, on incompressible and on sparse pages");
    for c in compression::CODECS {
        for data in ["random", "sparse"] {
            let fill = synthetic_fill(data, (batch * ps) as usize);
            io.extend(tier_passes(args, (&path, size), deepest, &Fill { data, pages: &fill }, ALL_OPS, c)?);
        }
    }

    let fills = tensor_fills(&trained, ps as usize, (args.tensor_size.bytes() / ps) as usize);
    if !fills.is_empty() {
        eprintln!("depth {deepest}: the trained tensors through the tier, none, LZ4 and zstd in turn");
    }
    let tensor_rows = tensor_io(args, &path, deepest, &fills)?;
    drop(fills);

    let to_gpu = if args.to_gpu {
        eprintln!("depth {deepest}: the tier's pages to host memory, then on to the GPU two ways");
        Some(storage_gpu::passes(&path, args.size.bytes(), ps, args.batch, deepest)?)
    } else {
        None
    };

    let mut codec: Vec<CodecRow> = Vec::new();
    for (i, kind) in compression::SYNTHETIC.iter().enumerate() {
        eprintln!("compression: {kind}");
        let data = compression::synthetic(kind, sample, i as u64 + 11);
        for c in compression::CODECS {
            codec.push(compression::measure(kind, &data, ps as usize, c));
        }
    }
    for (name, data) in &trained {
        eprintln!("compression: {name}");
        for c in compression::CODECS {
            codec.push(compression::measure(name, data, ps as usize, c));
        }
    }

    let (date, stamp) = report::now_stamps();
    let mut md = markdown(args, command_line, &date, &io, &codec);
    if !tensor_rows.is_empty() {
        tensor_markdown(&mut md, args, deepest, &tensor_rows);
    }
    if let Some((device, rows)) = &to_gpu {
        gpu_markdown(&mut md, device, rows);
    }
    let name = args.name.clone().unwrap_or_else(|| format!("storage-{stamp}"));
    let doc = json!({
        "benchmark": "storage", "date": date, "command": command_line, "dir": args.dir,
        "size": args.size.bytes(), "page_size": ps, "batch": args.batch, "io": io, "compression": codec,
        "tensor_io": tensor_rows, "to_gpu": to_gpu.as_ref().map(|(_, rows)| rows),
    });
    let (j, m) = report::write(&args.out, &name, &doc, &md).map_err(|e| format!("writing results: {e}"))?;
    println!("{md}");
    eprintln!("results: {} and {}", j.display(), m.display());
    let bad: u64 = codec.iter().map(|c| c.bad_pages).sum();
    if bad > 0 {
        return Err(format!("{bad} pages did not unpack to what was packed"));
    }
    Ok(())
}

fn markdown(args: &StorageArgs, command_line: &str, date: &str, io: &[IoRow], codec: &[CodecRow]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# vfabric-bench storage, {date}\n");
    let _ = writeln!(md, "- command: `{command_line}`");
    let _ = writeln!(
        md,
        "- file of {} in `{}`, pages of {}, {} pages a call to the tier from {} callers at once sharing the depth; fio: one job, `--direct=1 --ioengine=io_uring`, the same block size, depth and path; the tier checks every page's xxh3 as it reads, and the benchmark compares every page read back with what was written, both inside the timed reads; fio checks nothing",
        args.size,
        args.dir.display(),
        args.page_size,
        args.batch,
        args.callers
    );
    let _ = writeln!(md, "\n## The tier beside fio\n");
    let _ = writeln!(md, "| engine | op | data | compression | depth | GB/s | tier / fio | file bytes / page bytes |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for r in io {
        let fio = io.iter().find(|f| f.engine == "fio" && f.op == r.op && f.depth == r.depth);
        let ratio = match (r.engine, fio) {
            ("vfabric", Some(f)) => format!("{:.2}", r.gb_s / f.gb_s),
            _ => String::new(),
        };
        let share = r.stored_share.map(|s| format!("{s:.3}")).unwrap_or_default();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.2} | {ratio} | {share} |",
            r.engine, r.op, r.data, r.compression, r.depth, r.gb_s
        );
    }
    let _ = writeln!(md, "\n## Codecs page by page, one core\n");
    let _ = writeln!(md, "| data | codec | pages | ratio | pages packed | pack GB/s | unpack GB/s | bad pages |");
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for c in codec {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {:.2} | {:.0}% | {:.2} | {:.2} | {} |",
            c.data,
            c.codec,
            c.pages,
            c.ratio,
            c.packed_share * 100.0,
            c.pack_gb_s,
            c.unpack_gb_s,
            c.bad_pages
        );
    }
    md
}

fn gpu_markdown(md: &mut String, device: &str, rows: &[GpuRow]) {
    let _ = writeln!(md, "\n## On to a GPU ({device})\n");
    let _ = writeln!(md, "| way | depth | GB/s | / to host memory |");
    let _ = writeln!(md, "|---|---|---|---|");
    for r in rows {
        let _ = writeln!(md, "| {} | {} | {:.2} | {:.2} |", r.way, r.depth, r.gb_s, r.vs_host);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_tensors_take_a_page_of_each_in_turn() {
        let ps = 4096;
        let page = |b: u8, n: usize| vec![b; n * ps];
        let mut b = page(2, 1);
        b.extend(page(3, 1));
        // "a" holds 3 pages and a half page, "b" 2 pages, "c" less than a page (left out).
        let mut a = page(1, 3);
        a.extend(vec![9u8; ps / 2]);
        let trained = vec![("a".to_owned(), a), ("b".to_owned(), b), ("c".to_owned(), vec![7u8; ps - 1])];
        let fills = tensor_fills(&trained, ps, 4);
        let names: Vec<&str> = fills.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "all tensors"]);
        assert_eq!((fills[0].1.len(), fills[1].1.len()), (3 * ps, 2 * ps), "whole pages only");
        let firsts: Vec<u8> = fills[2].1.chunks(ps).map(|p| p[0]).collect();
        assert_eq!(firsts, [1, 2, 1, 3], "a page of each in turn, at most 4");
        assert!(tensor_fills(&trained[..1], ps, 8).iter().all(|(n, _)| n != "all tensors"), "one kind: no mix");
    }
}
