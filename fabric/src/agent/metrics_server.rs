//! The agent's `/metrics` endpoint (`[metrics] listen`): an HTTP server of its own thread (`tiny_http`) that
//! answers each scrape with [`Agent::metrics_text`], read on the agent's runtime. Scrapes come seconds apart
//! and take microseconds, so one thread serves them all, and none of the agent's threads waits on HTTP.

use std::net::SocketAddr;
use std::sync::Arc;

use super::metrics::CONTENT_TYPE;
use super::shared::Agent;
use crate::error::{FabricError, NetworkError};

/// A running metrics endpoint; it stops when dropped (and the agent stops timing its calls).
pub struct MetricsServer {
    agent: Agent,
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Where it listens (the port chosen, when `[metrics] listen` said 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.agent.shared.metrics.set_on(false);
        // The thread ends once it has answered the scrape it may be serving. It is not joined: this may run on
        // the agent's runtime, which that scrape may need to finish.
        self.server.unblock();
    }
}

impl Agent {
    /// Serves the agent's metrics at `http://addr/metrics` until the returned server is dropped. Call it from
    /// the agent's runtime (the scrapes read the agent there).
    pub fn serve_metrics(&self, addr: SocketAddr) -> Result<MetricsServer, FabricError> {
        let listen = |message: String| NetworkError::MetricsListen { addr, message };
        let server = Arc::new(tiny_http::Server::http(addr).map_err(|e| listen(e.to_string()))?);
        let addr = server.server_addr().to_ip().ok_or_else(|| listen("not an IP address".into()))?;
        let rt = tokio::runtime::Handle::try_current().map_err(|e| listen(e.to_string()))?;
        let (agent, srv) = (self.clone(), Arc::clone(&server));
        std::thread::Builder::new()
            .name("vfabric-metrics".into())
            .spawn(move || {
                for request in srv.incoming_requests() {
                    let response = match (request.method(), request.url()) {
                        (tiny_http::Method::Get, "/metrics") => {
                            let text = rt.block_on(agent.metrics_text());
                            let header =
                                tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE).expect("a valid header");
                            tiny_http::Response::from_string(text).with_header(header)
                        }
                        _ => tiny_http::Response::from_string("vfabric serves /metrics only\n").with_status_code(404),
                    };
                    if let Err(e) = request.respond(response) {
                        tracing::debug!(error = %e, "a metrics scrape went away");
                    }
                }
                tracing::debug!("the metrics endpoint stopped");
            })
            .map_err(|e| listen(e.to_string()))?;
        self.shared.metrics.set_on(true);
        tracing::info!(%addr, "serving metrics at /metrics");
        Ok(MetricsServer { agent: self.clone(), server, addr })
    }
}
