//! The configuration's tests: the shipped files, and every check a file gets.

use super::*;

#[test]
fn shipped_configs_parse() {
    let local = ClusterConfig::from_toml(EMBEDDED_LOCAL, "local").expect("local.toml");
    assert_eq!(local.device.backend, Backend::Auto);
    let h200 =
        ClusterConfig::from_toml(include_str!("../../../cluster-configs/h200x2.toml"), "h200x2").expect("h200x2.toml");
    assert_eq!(h200.memory.gpu_budget, Some(ByteSize(8 << 30)));
    assert_eq!(h200.memory.gpu_arena_bytes(141 << 30), 8 << 30);
    assert_eq!(h200.nodes[0].gpus, Some(vec![0, 1]));
    let netns = ClusterConfig::from_toml(include_str!("../../../cluster-configs/netns-3node.toml"), "netns")
        .expect("netns-3node.toml");
    assert_eq!(netns.node_index("n2").expect("n2"), 2);
    assert_eq!(netns.network.mtu, 8972);
    assert!(netns.node_index("n9").is_err());
    let agents = ClusterConfig::from_toml(include_str!("../../../cluster-configs/h200x2-agents.toml"), "agents")
        .expect("h200x2-agents.toml");
    assert_eq!(agents.nodes[1].gpus, Some(vec![1]));
    ClusterConfig::from_toml(include_str!("../../../cluster-configs/mpirun.toml"), "mpirun").expect("mpirun.toml");
}

#[test]
fn storage_and_tenants_parse_and_name_each_nodes_file() {
    let text = "[cluster]\nname = \"x\"\n[storage]\npath = \"/nvme/t\"\nsize = \"64GiB\"\n\
                [[tenant]]\nid = 3\ngpu = \"8GiB\"\nstorage = \"1TiB\"\n\
                [[node]]\nname = \"a\"\naddress = \"10.0.0.1:7000\"\n\
                [[node]]\nname = \"b\"\naddress = \"10.0.0.2:7000\"\n";
    let c = ClusterConfig::from_toml(text, "t").expect("parses");
    let s = c.storage.clone().expect("[storage]");
    assert_eq!((s.size, s.depth), (ByteSize(64 << 30), 64));
    assert_eq!(s.path_of(&c, 1), std::path::PathBuf::from("/nvme/t.b"), "each node its own file");
    assert_eq!(c.tenants[0].gpu, Some(ByteSize(8 << 30)));
    assert_eq!((c.tenants[0].host, c.tenants[0].storage), (None, Some(ByteSize(1 << 40))));
}

#[test]
fn bad_configs_are_reported() {
    let base = "[cluster]\nname = \"x\"\n";
    let bad = |extra: &str| ClusterConfig::from_toml(&format!("{base}{extra}"), "t").unwrap_err().to_string();
    assert!(bad("[memory]\npage_size = \"3MiB\"\n").contains("page_size"));
    assert!(bad("[memory]\nheadroom_percent = 100\n").contains("headroom"));
    assert!(bad("[memory]\nchunk_size = \"1MiB\"\n").contains("chunk_size"));
    assert!(bad("[memory]\nlow_watermark_percent = 95\n").contains("watermark"));
    assert!(bad("[memory]\nhost_low_watermark_percent = 95\nhost_high_watermark_percent = 80\n")
        .contains("memory.host_low_watermark_percent"));
    assert!(bad("[memory]\nhost_high_watermark_percent = 101\n").contains("memory.host_high_watermark_percent"));
    let host = format!("{base}[memory]\nhost_high_watermark_percent = 95\nhost_low_watermark_percent = 80\n");
    let m = ClusterConfig::from_toml(&host, "t").expect("host memory's watermarks").memory;
    assert_eq!((m.host_high_watermark_percent, m.host_low_watermark_percent), (95, 80));
    assert!(bad("[memory]\npage_sise = \"2MiB\"\n").contains("unknown field"));
    assert!(bad("[mover]\nshort_launch_pages = 481\n").contains("mover.short_launch_pages (481)"));
    assert!(bad("[device]\ncopy_deadline_ms = 0\n").contains("device.copy_deadline_ms"));
    assert!(bad("[device]\ncopy_deadline_ms = 86400001\n").contains("1..=86400000"));
    assert!(bad("[memory]\ngpu_budget = -1\n").contains("cannot be negative"));
    assert!(bad("[memory]\nhost_arena = 1.5\n").contains("whole number"));
    // A packed tier smaller than one of its slots (1,040 KiB of bf16 pages, 520 KiB of fp32 pages).
    assert!(bad("[memory]\npacked_arena = \"1MiB\"\n").contains("memory.packed_arena"));
    assert!(bad("[memory]\npacked_f32_arena = \"512KiB\"\n").contains("memory.packed_f32_arena"));
    let f32_slots = format!("{base}[memory]\npacked_f32_arena = \"520KiB\"\n");
    assert_eq!(
        ClusterConfig::from_toml(&f32_slots, "t").expect("one slot").memory.packed_f32_arena,
        ByteSize(520 << 10)
    );
    assert!(bad("[mover]\nthreads_per_block = 2048\n").contains("threads_per_block"));
    assert!(bad("[[node]]\nname = \"a\"\n[[node]]\nname = \"a\"\n").contains("twice"));
    assert!(bad("[[node]]\nname = \"a b\"\n").contains("node name"));
    // Names `cluster init` would refuse, refused here first.
    assert!(bad("[[node]]\nname = \"Gpu-A\"\n").contains("lower-case"));
    assert!(bad("[[node]]\nname = \"1234\"\n").contains("all digits"));
    // Files of several nodes say where each listens, on a port peers can reach.
    assert!(bad("[[node]]\nname = \"a\"\naddress = \"10.0.0.1:7000\"\n[[node]]\nname = \"b\"\n").contains("no address"));
    assert!(bad("[[node]]\nname = \"a\"\naddress = \"10.0.0.1:0\"\n").contains("port 0"));
    // A node belongs to a listed tenant or to none.
    assert!(bad("[[node]]\nname = \"a\"\ntenant = 3\n").contains("which no [[tenant]] lists"));
    let tenant_node = format!("{base}[[tenant]]\nid = 3\n[[node]]\nname = \"a\"\ntenant = 3\n");
    assert_eq!(ClusterConfig::from_toml(&tenant_node, "t").expect("a tenant's node").nodes[0].tenant, Some(3));
    assert!(bad("[[node]]\nname = \"a\"\naddress = \"nowhere\"\n").contains("ip:port"));
    assert!(bad("[network]\nmtu = 16384\n").contains("mtu"));
    assert!(bad("[network]\nheartbeat_ms = 500\ndead_after_ms = 400\n").contains("dead_after_ms"));
    assert!(bad("[network]\nlanes = 0\n").contains("lanes"));
    let nodes =
        "[[node]]\nname = \"a\"\naddress = \"10.0.0.1:7000\"\n[[node]]\nname = \"b\"\naddress = \"10.0.0.2:7000\"\n\
                 [[node]]\nname = \"c\"\naddress = \"10.0.0.3:7000\"\n";
    assert!(bad(&format!("[network]\nreplicas = 3\n{nodes}")).contains("needs [membership]"));
    assert!(bad(&format!("[network]\nreplicas = 5\n{nodes}")).contains("1 to 4"));
    let three = format!("{base}[network]\nreplicas = 3\n[membership]\netcd = [\"http://10.0.0.9:2379\"]\n{nodes}");
    assert_eq!(ClusterConfig::from_toml(&three, "t").expect("3 replicas with etcd").network.replicas, 3);
    assert!(bad("[network]\nsocket_buffer = \"4GiB\"\n").contains("socket_buffer"));
    assert!(bad("[storage]\npath = \"/x\"\nsize = \"3MiB\"\n").contains("storage.size"));
    assert!(bad("[storage]\npath = \"/x\"\nsize = \"4MiB\"\ndepth = 3\n").contains("storage.depth"));
    assert!(bad("[storage]\npath = \"\"\nsize = \"4MiB\"\n").contains("storage.path"));
    assert!(bad("[[tenant]]\nid = 1\n[[tenant]]\nid = 1\n").contains("tenant 1"));
    assert!(bad("[[tenant]]\nid = 1\nvram = \"1GiB\"\n").contains("unknown field"));
    assert!(bad("[network]\nlanes = 33\n").contains("lanes"));
    let two = |lanes: u16, a: &str, b: &str| {
        format!("[network]\nlanes = {lanes}\n[[node]]\nname = \"a\"\naddress = \"{a}\"\n[[node]]\nname = \"b\"\naddress = \"{b}\"\n")
    };
    assert!(bad(&two(2, "127.0.0.1:7000", "127.0.0.1:7001")).contains("overlap"));
    assert!(bad(&two(4, "127.0.0.1:7003", "127.0.0.1:7000")).contains("overlap"));
    assert!(bad(&two(2, "127.0.0.1:65535", "127.0.0.2:7000")).contains("65535"));
    // The latency lane takes a port too: 4 lanes take 5.
    assert!(bad(&two(4, "127.0.0.1:7000", "127.0.0.1:7004")).contains("overlap"));
    let no_latency_lane =
        two(1, "127.0.0.1:7000", "127.0.0.1:7001").replace("[network]\n", "[network]\nlatency_lane = false\n");
    for fine in
        [two(1, "127.0.0.1:7000", "127.0.0.1:7002"), two(4, "127.0.0.1:7000", "127.0.0.1:7005"), no_latency_lane]
    {
        ClusterConfig::from_toml(&format!("{base}{fine}"), "t").expect("lanes that fit");
    }
    ClusterConfig::from_toml(&format!("{base}{}", two(8, "10.0.0.1:7000", "10.0.0.2:7000")), "t").expect("two hosts");
    assert!(ClusterConfig::from_toml("", "t").is_err());
    let ok = ClusterConfig::from_toml(base, "t").expect("defaults");
    assert_eq!(ok.memory.gpu_arena_bytes(100 << 30), 80 << 30);
}

#[test]
fn the_wire_packs_with_lz4_or_not_at_all() {
    let with = |c: &str| format!("[cluster]\nname = \"x\"\n[network]\ncompression = \"{c}\"\n[[node]]\nname = \"a\"\n");
    let lz4 = ClusterConfig::from_toml(&with("lz4"), "t").expect("lz4");
    assert_eq!(lz4.network.compression, Compression::Lz4);
    assert_eq!(ClusterConfig::embedded_local().network.compression, Compression::None, "off by default");
    for refused in ["zstd", "fp8-bf16"] {
        let err = ClusterConfig::from_toml(&with(refused), "t").map(|_| ()).expect_err(refused).to_string();
        assert!(err.contains("network.compression") && err.contains("lz4"), "{refused}: {err}");
    }
    assert!(ClusterConfig::from_toml(&with("zip"), "t").is_err());
    // zstd regions cross with LZ4 unless asked.
    assert!(!lz4.network.wire_zstd, "off by default");
    let zstd = "[cluster]\nname = \"x\"\n[network]\nwire_zstd = true\n[[node]]\nname = \"a\"\n";
    let zstd = ClusterConfig::from_toml(zstd, "t").expect("wire_zstd");
    assert!(zstd.network.wire_zstd);
}
