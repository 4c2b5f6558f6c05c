//! `vfabric-bench lossy`: the lossy codecs (fp8 e4m3 and int8 codes with a scale per 256 values) on pages of
//! training data, as the fabric runs them when a lossy region's pages leave a GPU and come back: packed by the
//! GPU on the way to host memory, expanded on the way back, beside a plain copy of the same pages both ways in
//! the same run. Reports the size ratio, GB/s of values moved, and the error against the declared bound, for
//! synthetic tensors shaped like a model's state and any raw tensors (`*.bf16`, `*.fp32`) the caller dumps; then
//! the packed tier against host memory's frames ([`crate::packed_tier`]).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use serde_json::json;
use vfabric::ByteSize;
use vfabric_allocator::{Compression, Element, COMPRESSIONS};
use vfabric_transport::device::lossy;
use vfabric_transport::{
    open, Arena, ArenaSpec, Coding, DeviceKind, EngineChoice, Location, Mover, MoverConfig, OpenOptions, PageBatch,
    Transfer,
};

use crate::common::ConfigArgs;
use crate::compression;
use crate::report;
use crate::{compressed_tier, packed_tier};

/// Options of `vfabric-bench lossy`.
#[derive(Args, Debug, Clone)]
pub struct LossyArgs {
    /// The configuration and device layer.
    #[command(flatten)]
    pub target: ConfigArgs,
    /// Bytes of values per case (default: 1GiB on GPUs, 32MiB on the emulated device).
    #[arg(long)]
    pub size: Option<ByteSize>,
    /// Page size.
    #[arg(long, default_value = "2MiB")]
    pub page_size: ByteSize,
    /// Timed runs of each move (the median is reported).
    #[arg(long, default_value_t = 5)]
    pub iters: usize,
    /// A folder of raw tensors (`NAME.bf16` or `NAME.fp32`, one per file), beside the synthetic ones.
    #[arg(long)]
    pub tensors: Option<PathBuf>,
    /// Results folder.
    #[arg(long, default_value = "bench/out")]
    pub out: PathBuf,
    /// Name for the result files (default: lossy-TIME).
    #[arg(long)]
    pub name: Option<String>,
    /// The packed tier part: the GPU budget (default: 2GiB on GPUs, 32MiB on the emulated device).
    #[arg(long)]
    pub tier_budget: Option<ByteSize>,
    /// The packed tier part: host memory (default: 4GiB on GPUs, 32MiB on the emulated device).
    #[arg(long)]
    pub tier_host: Option<ByteSize>,
    /// The packed tier part: where the storage tier's file goes (a filesystem with O_DIRECT).
    #[arg(long, default_value = "bench/out/lossy-tier")]
    pub tier_dir: PathBuf,
    /// Skips the tier parts (the packed tiers and the compressed tier).
    #[arg(long)]
    pub no_tier: bool,
    /// Runs the compressed tier part only of the tier parts.
    #[arg(long)]
    pub compressed_only: bool,
    /// The compressed tier part: the lossless codecs of the regions walked over a compressed tier, each beside
    /// the same uncompressed baseline (default: lz4,zstd with `--tensor-walks-only`; lz4 otherwise, where the
    /// synthetic kinds' regions are many).
    #[arg(long, value_delimiter = ',')]
    pub tier_codecs: Option<Vec<Compression>>,
    /// The compressed tier part walks only the tensors of `--tensors` over the tiers (not the synthetic kinds;
    /// its comparison in memory still runs).
    #[arg(long)]
    pub tensor_walks_only: bool,
}

/// One kind of data through one codec.
#[derive(Debug, Clone, Serialize)]
pub struct LossyRow {
    /// What the pages hold.
    pub data: String,
    /// The codec.
    pub codec: String,
    /// Pages moved each way.
    pub pages: u64,
    /// Page bytes over packed bytes.
    pub ratio: f64,
    /// GPU -> host: a plain copy (copy engine), GB/s of page bytes.
    pub copy_out_gb_s: f64,
    /// GPU -> host packed by the kernel, GB/s of page bytes (values), and over the copy.
    pub pack_gb_s: f64,
    /// `pack_gb_s` over `copy_out_gb_s`.
    pub pack_vs_copy: f64,
    /// Host -> GPU: a plain copy, GB/s of page bytes.
    pub copy_in_gb_s: f64,
    /// Host -> GPU expanded by the kernel, GB/s of page bytes.
    pub unpack_gb_s: f64,
    /// `unpack_gb_s` over `copy_in_gb_s`.
    pub unpack_vs_copy: f64,
    /// The largest error over its declared bound (at most 1 when the bound holds).
    pub worst_over_bound: f64,
    /// Root mean square error over the root mean square value.
    pub rel_rms_error: f64,
    /// Packed pages that differ from the CPU codec's packing of the same page.
    pub pages_unlike_cpu: u64,
    /// The CPU codec on one core (what host reads and writes of packed pages run), GB/s of page bytes.
    pub cpu: CpuCodec,
}

/// The CPU codec on one core, beside a plain copy of the same pages in host memory.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuCodec {
    /// Pages (values) copied, GB/s.
    pub copy_gb_s: f64,
    /// Pages packed, GB/s of values.
    pub pack_gb_s: f64,
    /// Packed pages expanded, GB/s of values.
    pub unpack_gb_s: f64,
}

/// Times the CPU codec on one core over the whole pages of `data` (at most 64 MiB of them), best of `iters`
/// runs (at least 3), beside copying the same pages; checks every value it expands against its bound.
fn cpu_codec(l: vfabric_allocator::Lossy, data: &[u8], ps: usize, iters: usize) -> Result<CpuCodec, String> {
    let pages: Vec<&[u8]> = data.chunks_exact(ps).take((64 << 20) / ps).collect();
    let n = l.packed_len(ps as u64) as usize;
    let (mut packed, mut back) = (vec![0u8; n * pages.len()], vec![0u8; ps * pages.len()]);
    let best = |f: &mut dyn FnMut()| {
        (0..iters.max(3))
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .fold(f64::INFINITY, f64::min)
    };
    let copy = best(&mut || {
        for (p, out) in pages.iter().zip(back.chunks_exact_mut(ps)) {
            out.copy_from_slice(p);
        }
        std::hint::black_box(&back);
    });
    let pack = best(&mut || {
        for (p, out) in pages.iter().zip(packed.chunks_exact_mut(n)) {
            lossy::pack(l, p, out);
        }
        std::hint::black_box(&packed);
    });
    let unpack = best(&mut || {
        for (p, out) in packed.chunks_exact(n).zip(back.chunks_exact_mut(ps)) {
            lossy::unpack(l, p, out);
        }
        std::hint::black_box(&back);
    });
    for (p, out) in pages.iter().zip(back.chunks_exact(ps)) {
        if lossy::worst_error(l, p, out).0 > 1.0 {
            return Err(format!("{l:?}: a value expanded by the CPU codec broke its bound"));
        }
    }
    let gb = |s: f64| (pages.len() * ps) as f64 / s / 1e9;
    Ok(CpuCodec { copy_gb_s: gb(copy), pack_gb_s: gb(pack), unpack_gb_s: gb(unpack) })
}

/// The synthetic kinds measured, with their values.
const SYNTHETIC: [(&str, Element); 4] = [
    ("bf16 weights, N(0, 0.02)", Element::Bf16),
    ("bf16 activations, GELU(N(0, 1))", Element::Bf16),
    ("fp32 Adam first moment, N(0, 1e-4)", Element::F32),
    ("fp32 Adam second moment, (N(0, 1e-3))^2", Element::F32),
];

/// Runs a move `iters` times; the median seconds (device-measured where the device measures).
fn median_s(iters: usize, mut submit: impl FnMut() -> Result<Transfer, String>) -> Result<f64, String> {
    let mut t = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = Instant::now();
        let r = submit()?.wait().map_err(|e| e.to_string())?;
        t.push(r.device_time.map_or(start.elapsed().as_secs_f64(), |d| d.as_secs_f64()));
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// Arenas and a mover for the cases: values on the GPU, packed pages in host memory, expanded pages on the GPU.
struct Rig {
    mover: Arc<dyn Mover>,
    values: Arc<dyn Arena>,
    host: Arc<dyn Arena>,
    back: Arc<dyn Arena>,
    batch: PageBatch,
    iters: usize,
}

impl Rig {
    fn case(&self, name: &str, data: &[u8], c: Compression) -> Result<LossyRow, String> {
        let l = c.lossy().ok_or("not a lossy codec")?;
        let (ps, pages) = (self.batch.page_size() as usize, self.batch.len());
        let bytes = (ps * pages) as u64;
        let mut filled = 0;
        while filled < bytes as usize {
            let n = data.len().min(bytes as usize - filled);
            self.values.write(filled as u64, &data[..n]).map_err(|e| e.to_string())?;
            filled += n;
        }
        let e = |e: vfabric_transport::MoveError| e.to_string();
        let (m, b) = (&self.mover, &self.batch);
        let copy_out =
            median_s(self.iters, || m.submit(&self.values, &self.host, b, EngineChoice::CopyEngine).map_err(e))?;
        let copy_in =
            median_s(self.iters, || m.submit(&self.host, &self.back, b, EngineChoice::CopyEngine).map_err(e))?;
        let pack = median_s(self.iters, || m.submit_coded(&self.values, &self.host, b, Coding::Pack(l)).map_err(e))?;
        let unpack = median_s(self.iters, || m.submit_coded(&self.host, &self.back, b, Coding::Unpack(l)).map_err(e))?;
        // What came back, against what was written, page by page; and the GPU's packing against the CPU's.
        let (mut worst, mut err2, mut val2, mut unlike) = (0f64, 0f64, 0f64, 0u64);
        let (mut orig, mut got, mut packed) = (vec![0u8; ps], vec![0u8; ps], vec![0u8; ps]);
        let n = l.packed_len(ps as u64) as usize;
        let mut cpu = vec![0u8; n];
        for p in 0..pages as u64 {
            let at = p * ps as u64;
            self.values.read(at, &mut orig).map_err(|e| e.to_string())?;
            self.back.read(at, &mut got).map_err(|e| e.to_string())?;
            self.host.read(at, &mut packed).map_err(|e| e.to_string())?;
            worst = worst.max(lossy::worst_error(l, &orig, &got).0);
            lossy::pack(l, &orig, &mut cpu);
            unlike += u64::from(cpu[..] != packed[..n]);
            for i in 0..ps / l.element.bytes() {
                let (x, y) = (lossy::value(&orig, i, l.element), lossy::value(&got, i, l.element));
                err2 += f64::from(x - y).powi(2);
                val2 += f64::from(x).powi(2);
            }
        }
        let gb = |s: f64| bytes as f64 / s / 1e9;
        Ok(LossyRow {
            data: name.to_owned(),
            codec: c.to_string(),
            pages: pages as u64,
            ratio: ps as f64 / n as f64,
            copy_out_gb_s: gb(copy_out),
            pack_gb_s: gb(pack),
            pack_vs_copy: copy_out / pack,
            copy_in_gb_s: gb(copy_in),
            unpack_gb_s: gb(unpack),
            unpack_vs_copy: copy_in / unpack,
            worst_over_bound: worst,
            rel_rms_error: if val2 > 0.0 { (err2 / val2).sqrt() } else { 0.0 },
            pages_unlike_cpu: unlike,
            cpu: cpu_codec(l, data, ps, self.iters)?,
        })
    }
}

/// Raw tensors with their values, named by their extension.
fn tensors(trained: &[(String, Vec<u8>)]) -> Vec<(String, Element, Vec<u8>)> {
    let mut out = Vec::new();
    for (name, data) in trained {
        let element = match name.rsplit('.').next() {
            Some("bf16") => Element::Bf16,
            Some("fp32") => Element::F32,
            _ => continue,
        };
        out.push((name.clone(), element, data.clone()));
    }
    out
}

/// Runs the benchmark and writes its results.
pub fn run(args: &LossyArgs, command_line: &str) -> Result<(), String> {
    let cfg = args.target.load()?;
    let ps = args.page_size.bytes();
    if args.iters == 0 || ps == 0 || ps % (1 << 16) != 0 {
        return Err("--iters must be at least 1 and --page-size a multiple of 64 KiB".into());
    }
    let tier_codecs = args.tier_codecs.clone().unwrap_or_else(|| match args.tensor_walks_only {
        true => vec![Compression::Lz4, Compression::Zstd],
        false => vec![Compression::Lz4],
    });
    if let Some(c) = tier_codecs.iter().find(|c| !c.is_lossless()) {
        return Err(format!("--tier-codecs {c}: lz4 or zstd (the compressed tier holds lossless pages)"));
    }
    let emulated_size = 32u64 << 20;
    let opened = open(&OpenOptions {
        backend: cfg.device.backend,
        emulated_gpus: 1,
        emulated_gpu_memory: cfg
            .device
            .emulated_gpu_memory
            .bytes()
            .max(4 * args.size.map_or(emulated_size, |s| s.bytes())),
        emulated_host_link: 0,
    })
    .map_err(|e| e.to_string())?;
    let layer = opened.layer;
    if let Some(why) = &opened.fallback_reason {
        eprintln!("no usable GPU ({why}): the emulated device packs on the CPU; its figures are the CPU codec's");
    }
    eprintln!("{}", layer.describe());
    let emulated = layer.kind() == DeviceKind::Emulated;
    let size = args.size.map_or(if emulated { emulated_size } else { 1 << 30 }, |s| s.bytes()) / ps * ps;
    if size == 0 {
        return Err(format!("--size is less than a page of {}", ByteSize(ps)));
    }
    let arena = |location| {
        layer.create_arena(&ArenaSpec { location, bytes: size, chunk_bytes: size }).map_err(|e| e.to_string())
    };
    let rig = Rig {
        mover: layer.mover(MoverConfig::default()).map_err(|e| e.to_string())?,
        values: arena(Location::Gpu(0))?,
        host: arena(Location::Host)?,
        back: arena(Location::Gpu(0))?,
        batch: PageBatch::contiguous(ps, 0, 0, (size / ps) as u32),
        iters: args.iters,
    };
    let sample = (size as usize).min(256 << 20);
    let mut sources: Vec<(String, Element, Vec<u8>)> = SYNTHETIC
        .iter()
        .enumerate()
        .map(|(i, &(kind, e))| (kind.to_owned(), e, compression::synthetic(kind, sample, i as u64 + 11)))
        .collect();
    // The trained tensors as they are, for the compressed tier (lossless), and with their values for the codecs.
    let trained = match &args.tensors {
        Some(dir) => compression::tensors(dir, sample)?,
        None => Vec::new(),
    };
    sources.extend(tensors(&trained));
    let mut rows = Vec::new();
    for (name, element, data) in &sources {
        for c in COMPRESSIONS.into_iter().filter(|c| c.lossy().is_some_and(|l| l.element == *element)) {
            eprintln!("{name}: {c}");
            rows.push(rig.case(name, data, c)?);
        }
    }
    drop(rig);
    let tier = if args.no_tier {
        None
    } else {
        let (budget, host) = if emulated { (32 << 20, 32 << 20) } else { (2 << 30, 4 << 30) };
        let budget = args.tier_budget.map_or(budget, |b| b.bytes()) / ps * ps;
        let host = args.tier_host.map_or(host, |h| h.bytes()) / ps * ps;
        let packed =
            if args.compressed_only { None } else { Some(packed_tier::run(&cfg, budget, host, ps, &args.tier_dir)?) };
        Some((
            packed,
            compressed_tier::run(
                &cfg,
                (budget, host, ps),
                &tier_codecs,
                &args.tier_dir,
                &trained,
                !args.tensor_walks_only,
            )?,
        ))
    };
    let (date, stamp) = report::now_stamps();
    let mut md = markdown(command_line, &date, &layer.describe(), size, ps, &rows);
    if let Some((t, c)) = &tier {
        md += t.as_ref().map_or("", |t| &t.markdown);
        md += &c.1;
    }
    let name = args.name.clone().unwrap_or_else(|| format!("lossy-{stamp}"));
    let doc = json!({
        "benchmark": "lossy", "date": date, "command": command_line, "device": layer.describe(),
        "bytes": size, "page_size": ps, "iters": args.iters, "rows": rows,
        "packed_tier": tier.as_ref().and_then(|t| t.0.as_ref()).map(|t| &t.rows),
        "host_reads": tier.as_ref().and_then(|t| t.0.as_ref()).map(|t| &t.reads),
        "compressed_tier": tier.as_ref().map(|t| &t.1 .0),
    });
    let (j, m) = report::write(&args.out, &name, &doc, &md).map_err(|e| format!("writing results: {e}"))?;
    println!("{md}");
    eprintln!("results: {} and {}", j.display(), m.display());
    let over: Vec<&LossyRow> = rows.iter().filter(|r| r.worst_over_bound > 1.0 || r.pages_unlike_cpu > 0).collect();
    if !over.is_empty() {
        return Err(format!("{} cases broke their bound or differ from the CPU codec", over.len()));
    }
    if let Some(r) = tier.iter().flat_map(|t| t.0.iter()).flat_map(|t| &t.rows).find(|r| r.worst_over_bound > 1.0) {
        return Err(format!("the packed tier part ({}): a value broke its bound", r.setup));
    }
    Ok(())
}

fn markdown(command_line: &str, date: &str, device: &str, size: u64, ps: u64, rows: &[LossyRow]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# vfabric-bench lossy, {date}\n");
    let _ = writeln!(md, "- command: `{command_line}`");
    let _ = writeln!(md, "- device: {device}");
    let _ = writeln!(
        md,
        "- {} of values in pages of {}, GPU -> host and back: a plain copy-engine copy beside the codec's kernels \
         (packed on the GPU into host memory, expanded from it); GB/s count page bytes (values), medians; every \
         value checked against its declared bound, every packed page against the CPU codec's\n",
        ByteSize(size),
        ByteSize(ps)
    );
    let _ = writeln!(
        md,
        "| data | codec | ratio | copy out GB/s | pack GB/s (x copy) | copy in GB/s | unpack GB/s (x copy) | worst / bound | rel. RMS error | pages unlike the CPU's |"
    );
    let _ = writeln!(md, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            md,
            "| {} | {} | {:.2} | {:.1} | {:.1} ({:.2}) | {:.1} | {:.1} ({:.2}) | {:.3} | {:.4} | {} |",
            r.data,
            r.codec,
            r.ratio,
            r.copy_out_gb_s,
            r.pack_gb_s,
            r.pack_vs_copy,
            r.copy_in_gb_s,
            r.unpack_gb_s,
            r.unpack_vs_copy,
            r.worst_over_bound,
            r.rel_rms_error,
            r.pages_unlike_cpu
        );
    }
    let _ = writeln!(
        md,
        "\n## The CPU codec\n\n- one core, the same pages (at most 64 MiB of each kind) in host memory, best of \
         the runs: a plain copy of the pages beside packing and expanding them as host reads and writes of packed \
         pages do; GB/s count page bytes (values)\n"
    );
    let _ = writeln!(md, "| data | codec | copy GB/s | pack GB/s (x copy) | expand GB/s (x copy) |");
    let _ = writeln!(md, "|---|---|---:|---:|---:|");
    for r in rows {
        let c = r.cpu;
        let _ = writeln!(
            md,
            "| {} | {} | {:.1} | {:.2} ({:.2}) | {:.2} ({:.2}) |",
            r.data,
            r.codec,
            c.copy_gb_s,
            c.pack_gb_s,
            c.pack_gb_s / c.copy_gb_s,
            c.unpack_gb_s,
            c.unpack_gb_s / c.copy_gb_s
        );
    }
    md
}
