//! A local client's regions follow the cluster's `network.replicas` unless the client chooses (as Python's
//! `alloc(..., replicas=, replica_lag=)` does): with 2, a region a process allocates through its node's agent
//! gets a standby copy on another node, which has the process's writes and takes the region over when the agent
//! stops. (Before, a client's regions stayed on their home only, whatever the cluster said.)

use std::time::Duration;

use vfabric::agent::{AllocOptions, Replication};
use vfabric_tests::loopback::{cluster, config};
use vfabric_transport::quic::ClusterCa;

#[test]
fn a_local_clients_regions_are_replicated_as_the_cluster_says() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut cfg = config(2);
        cfg.network.replicas = 2;
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let path = std::env::temp_dir().join(format!("vfabric-client-replicas-{}.sock", std::process::id()));
        a[0].serve_local(&path).await.expect("serve the socket");
        let socket = path.clone();
        let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let written = data.clone();
        // The client's calls block: off the runtime's threads.
        let r = tokio::task::spawn_blocking(move || {
            let c = vfabric::AttachedClient::attach(&socket).expect("attach");
            let keep = AllocOptions { keep: true, ..AllocOptions::default() };
            let r = c.alloc(1 << 20, &keep).expect("a region through the agent");
            c.write(&r, 0, &written).expect("the client writes it");
            // Its own choice: on its home only, and a standby that may lag a minute behind.
            let one = AllocOptions { replication: Replication::sync(1), ..keep };
            c.alloc(1 << 20, &one).expect("a region on its home only");
            let lagging = AllocOptions { replication: Replication::lagging(2, Duration::from_secs(60)), ..keep };
            let l = c.alloc(1 << 20, &lagging).expect("a region whose standby may lag");
            c.write(&l, 0, &written[..4096]).expect("a write acknowledged before the standby has it");
            r
        })
        .await
        .expect("the client");
        assert_eq!((a[0].replication(), a[1].replication()), ((2, 0), (0, 2)), "two standbys on n1, not three");
        assert!(a[0].replication_lag().await > Duration::ZERO, "the lagging region's standby is behind");
        // n0 stops: n1 takes the region over, with the client's bytes (n1 never dialled n0: n0's endpoint,
        // closed, refuses it, which says n0 shut down).
        let mut got = vec![0u8; 1 << 20];
        a[0].shutdown().await;
        a[1].read(&r, 0, &mut got).await.expect("n1 reads the region it took over");
        assert!(got == data, "the standby has what the client wrote");
        a[1].shutdown().await;
        let _ = std::fs::remove_file(&path);
    });
}
