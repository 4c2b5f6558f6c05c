//! An acquire of another node's pages dropped at any point of its way (a timeout around it, a cancelled task)
//! leaves no lease behind at the home: the caller tells the home it abandoned the request. Before, one dropped
//! once the home had granted it kept the home's lease until the connection closed, and the home's writers out
//! with it.

use std::time::{Duration, Instant};

use vfabric_tests::loopback::{cluster, config};
use vfabric_transport::quic::ClusterCa;
use vfabric_transport::Location;

#[test]
fn acquires_dropped_midway_leave_no_lease_at_the_home() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    rt.block_on(async {
        let cfg = config(2);
        let ca = ClusterCa::generate("loop").expect("ca");
        let a = cluster(&cfg, &ca).await;
        let ps = a[0].fabric().page_size();
        let r = a[0].alloc(1, 8 * ps, None).await.expect("a region on n1");
        a[0].write(&r, 0, &vec![7u8; (8 * ps) as usize]).await.expect("write");
        let leases = |i: usize| a[i].fabric().stats().directory.leases;
        // Cut short at every point of their way: before the home's answer, while the pages come, after.
        let (mut cut, mut done) = (0, 0);
        for i in 0..300u64 {
            // 10 us to about 70 ms, each step 3% longer.
            let limit = Duration::from_secs_f64(10e-6 * 1.03f64.powi(i as i32));
            // Read leases: those still being let go in the background do not refuse the next one.
            let acquire = a[0].acquire(&r, 0..8 * ps, Location::Gpu(0), vfabric::Mode::Read);
            match tokio::time::timeout(limit, acquire).await {
                // Done in time: released as it goes (dropped).
                Ok(lease) => {
                    drop(lease.expect("acquire"));
                    done += 1;
                }
                Err(_) => cut += 1,
            }
        }
        assert!(cut > 0 && done > 0, "some acquires were cut short ({cut}) and some finished ({done})");
        // Whatever was granted is let go, while the connection stays open.
        let t = Instant::now();
        while leases(1) > 0 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "n1 still holds {} lease(s) for dropped acquires",
                leases(1)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // And a write at the home goes through.
        a[1].write(&r, 0, &[1u8; 16]).await.expect("a write at the home");
        for x in &a {
            x.shutdown().await;
        }
    });
}
