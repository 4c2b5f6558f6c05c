//! `vfabric-bench storage`: the storage tier's file I/O (io_uring, O_DIRECT, every page checksummed) writing and
//! reading a file of pages, beside fio doing the same with O_DIRECT and io_uring on the same path, at the same
//! queue depth and block size, in the same run; the tier's cost of LZ4 and zstd on incompressible pages and
//! their gain on compressible ones; and the compression figures of `compression`.

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
    /// The pages' data: "random" or "sparse".
    pub data: &'static str,
    /// "none" or "lz4".
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

fn row(
    engine: &'static str,
    op: &'static str,
    data: &'static str,
    c: Compression,
    depth: u32,
    bytes: u64,
    secs: f64,
) -> IoRow {
    IoRow {
        engine,
        op,
        data,
        compression: c.to_string(),
        depth,
        callers: 1,
        bytes,
        seconds: secs,
        gb_s: bytes as f64 / secs.max(1e-9) / 1e9,
        stored_share: None,
    }
}

/// The tier writing every slot in order, reading them back in order, then in a random order, `batch` pages a
/// call, the calls dealt round-robin to `args.callers` threads sharing the depth; the file is removed at the
/// end. Every read is checked by the tier; the bytes are compared here too.
fn tier_passes(
    args: &StorageArgs,
    path: &Path,
    depth: u32,
    data: &'static str,
    c: Compression,
) -> Result<Vec<IoRow>, String> {
    let ps = args.page_size.bytes();
    let slots = args.size.bytes() / ps;
    let batch = args.batch.clamp(1, slots.max(1));
    let callers = args.callers.max(1);
    let per_caller = (depth / callers).max(1);
    let tier = StorageFile::create(&StorageSpec {
        path: path.to_owned(),
        bytes: slots * ps,
        page_size: ps,
        depth: per_caller,
    })
    .map_err(|e| e.to_string())?;
    let fill = compression::synthetic(
        if data == "sparse" { "sparse: zeros, a number every 4 KiB" } else { "random bytes" },
        (batch * ps) as usize,
        7,
    );
    let sequential: Vec<u64> = (0..slots).collect();
    let random: Vec<u64> = shuffled(slots as u32, 0x5EED).into_iter().map(u64::from).collect();
    let mut rows = Vec::new();
    for (op, order) in [("write", &sequential), ("read", &sequential), ("randread", &random)] {
        let calls: Vec<&[u64]> = order.chunks(batch as usize).collect();
        let t = Instant::now();
        let bad: u64 = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..callers as usize)
                .map(|w| {
                    let (tier, fill, calls) = (&tier, &fill, &calls);
                    scope.spawn(move || caller(tier, op, fill, calls.iter().skip(w).step_by(callers as usize), ps, c))
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
        let mut r = row("vfabric", op, data, c, depth, slots * ps, secs);
        r.callers = callers;
        if op == "write" {
            let (file_bytes, _) = tier.stored();
            r.stored_share = Some(file_bytes as f64 / (slots * ps) as f64);
        }
        rows.push(r);
    }
    Ok(rows)
}

/// One caller's share of a pass: its calls in turn, from and into buffers of its own. Slot s holds the page
/// written from place s % batch of `fill`. Returns the pages read back wrong.
fn caller<'a>(
    tier: &StorageFile,
    op: &str,
    fill: &[u8],
    calls: impl Iterator<Item = &'a &'a [u64]>,
    ps: u64,
    c: Compression,
) -> Result<u64, String> {
    let batch = fill.len() / ps as usize;
    let mut src = AlignedBuffer::new(fill.len()).ok_or("no memory for the pages")?;
    src.copy_from_slice(fill);
    let mut dst = AlignedBuffer::new(fill.len()).ok_or("no memory for the pages")?;
    let page = |s: u64| &src[(s as usize % batch) * ps as usize..][..ps as usize];
    let mut bad = 0;
    for call in calls {
        if op == "write" {
            let pages: Vec<(u64, &[u8])> = call.iter().map(|&s| (s, page(s))).collect();
            tier.write(&pages, c).map_err(|e| e.to_string())?;
            continue;
        }
        let mut pages: Vec<(u64, &mut [u8])> = call.iter().copied().zip(dst.chunks_mut(ps as usize)).collect();
        tier.read(&mut pages).map_err(|e| e.to_string())?;
        bad += call.iter().zip(dst.chunks(ps as usize)).filter(|&(&s, got)| got != page(s)).count() as u64;
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
    for &depth in &args.depth {
        eprintln!("depth {depth}: the tier, then fio, over {} of {} pages", args.size, args.page_size);
        io.extend(tier_passes(args, &path, depth, "random", Compression::None)?);
        io.extend(fio_passes(args, &path, depth)?);
    }
    let deepest = args.depth.iter().copied().max().unwrap_or(32);
    eprintln!("depth {deepest}: the tier with LZ4 and zstd, on incompressible and on sparse pages");
    for c in compression::CODECS {
        io.extend(tier_passes(args, &path, deepest, "random", c)?);
        io.extend(tier_passes(args, &path, deepest, "sparse", c)?);
    }

    let to_gpu = if args.to_gpu {
        eprintln!("depth {deepest}: the tier's pages to host memory, then on to the GPU two ways");
        Some(storage_gpu::passes(&path, args.size.bytes(), ps, args.batch, deepest)?)
    } else {
        None
    };

    let sample = args.codec_sample.bytes() as usize;
    let mut codec: Vec<CodecRow> = Vec::new();
    for (i, kind) in compression::SYNTHETIC.iter().enumerate() {
        eprintln!("compression: {kind}");
        let data = compression::synthetic(kind, sample, i as u64 + 11);
        for c in compression::CODECS {
            codec.push(compression::measure(kind, &data, ps as usize, c));
        }
    }
    if let Some(dir) = &args.tensors {
        for (name, data) in compression::tensors(dir, sample)? {
            eprintln!("compression: {name}");
            for c in compression::CODECS {
                codec.push(compression::measure(&name, &data, ps as usize, c));
            }
        }
    }

    let (date, stamp) = report::now_stamps();
    let mut md = markdown(args, command_line, &date, &io, &codec);
    if let Some((device, rows)) = &to_gpu {
        gpu_markdown(&mut md, device, rows);
    }
    let name = args.name.clone().unwrap_or_else(|| format!("storage-{stamp}"));
    let doc = json!({
        "benchmark": "storage", "date": date, "command": command_line, "dir": args.dir,
        "size": args.size.bytes(), "page_size": ps, "batch": args.batch, "io": io, "compression": codec,
        "to_gpu": to_gpu.as_ref().map(|(_, rows)| rows),
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
