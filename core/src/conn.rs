//! Connection hygiene for every listener: what a connection must do, and how many it may be,
//! before a role spends anything on it. Written once; every server role uses it.
//!
//! - **Caps.** A listener holds at most [`Limits::max_connections`] connections at once, and
//!   at most [`Limits::max_connections_per_address`] from one peer IP address. One more is
//!   closed as soon as it is accepted, before any TLS or HTTP work, with a warning naming the
//!   listener, the peer and the limit (at most one line per listener every 10 s, with the count
//!   of the others refused meanwhile) and the `gma_connections_refused_total` counter.
//! - **Handshakes** run in their own tasks, so a slow peer never holds up the others: the TLS
//!   handshake and, on gRPC listeners, the HTTP/2 connection preface must arrive within
//!   [`Limits::handshake_timeout_ms`] of the accept, or the connection is closed. The preface is
//!   checked byte by byte as it arrives (anything else is closed at once) and replayed to the
//!   HTTP/2 server.
//! - **Liveness.** The kernel finds dead peers without waking the role: every accepted socket
//!   has TCP keep-alive (a probe after [`Limits::keepalive_interval_ms`] with nothing received,
//!   then one every as long) and `TCP_USER_TIMEOUT` of [`Limits::keepalive_timeout_ms`] (sent
//!   data or probes unacknowledged that long close the connection). gRPC servers also send an
//!   HTTP/2 PING on a connection from which nothing has arrived for
//!   [`Limits::http2_ping_interval_ms`] and close it when no answer comes within the timeout
//!   ([`grpc_server`]): a peer whose kernel answers but whose process does not. That interval
//!   is long (5 minutes) because a subscriber only reads, so its connection would be pinged
//!   every interval: each PING wakes the serving role up to four times (tokio's timer wheel
//!   on the way to the deadline, the PING, its answer), which was a quarter of the agent's
//!   wake-ups at 10 s (docs/PERFORMANCE.md). HTTP/1 servers ([`serve_http`])
//!   close a connection whose request headers have not all arrived within
//!   [`Limits::header_read_timeout_ms`] — counted from when the server starts waiting for a
//!   request, so it is also how long an idle keep-alive connection stays open.
//!
//! gRPC roles build their server with [`grpc_server`] and serve their [`Services`] with
//! [`serve_grpc`] on [`Incoming::grpc`], which adds the standard health and reflection
//! services to every listener; HTTP roles (dashboard, `/metrics`, the producer's Prometheus endpoint)
//! call [`serve_http`]. TLS is done here, with the rustls config of
//! [`crate::tls::ServerTls::rustls_config`] for gRPC (tonic still sees its own `TlsStream`, so
//! `Request::peer_certs` and `remote_addr` work as before) and, for HTTP, the one the dashboard
//! builds (`gma_dashboard::tls::server_config`: client certificates optional or required);
//! every HTTP request carries the [`Peer`]: its address and the identity of its verified
//! client certificate.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::{Request, Response};
use tonic::codegen::{Body as HttpBody, Bytes, Service};
use tonic::server::NamedService;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tower_layer::Layer;

use crate::guard::Limits;

/// The counter of connections closed by a cap (label `role`, `reason`).
pub const REFUSED: &str = "gma_connections_refused_total";

/// What an HTTP/2 client sends first (RFC 9113, 3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connections accepted but still in their handshake, queued for the server.
const HANDSHAKEN_QUEUE: usize = 1024;

/// How often a listener logs that a cap bites.
const LOG_EVERY: Duration = Duration::from_secs(10);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------------------------------------
// Caps.

#[derive(Default)]
struct Count {
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
    last_log: Option<Instant>,
    unlogged: u64,
}

/// The open connections of one listener.
struct Gauge {
    role: &'static str,
    local: SocketAddr,
    max: usize,
    per_address: usize,
    count: Mutex<Count>,
}

impl Gauge {
    fn new(role: &'static str, local: SocketAddr, limits: &Limits) -> Arc<Gauge> {
        Arc::new(Gauge {
            role,
            local,
            max: limits.max_connections,
            per_address: limits.max_connections_per_address,
            count: Mutex::new(Count::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Count> {
        match self.count.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        }
    }

    /// A permit for a connection from `peer`, or `None` (and a log line) over a cap.
    fn admit(self: &Arc<Self>, peer: SocketAddr) -> Option<Permit> {
        let ip = peer.ip();
        let mut c = self.lock();
        let from_ip = c.by_ip.get(&ip).copied().unwrap_or(0);
        let refused = if c.total >= self.max {
            Some((
                "listener",
                format!(
                    "{} connections are open (limit max_connections = {})",
                    c.total, self.max
                ),
            ))
        } else if from_ip >= self.per_address {
            Some((
                "address",
                format!(
                    "{from_ip} connections from {ip} are open (limit max_connections_per_address = {})",
                    self.per_address
                ),
            ))
        } else {
            None
        };
        if let Some((reason, why)) = refused {
            metrics::counter!(REFUSED, "role" => self.role, "reason" => reason).increment(1);
            let now = Instant::now();
            if c.last_log.is_none_or(|t| now.duration_since(t) >= LOG_EVERY) {
                let others = std::mem::take(&mut c.unlogged);
                c.last_log = Some(now);
                drop(c);
                let more = if others > 0 {
                    format!(" ({others} more refused since the last report)")
                } else {
                    String::new()
                };
                tracing::warn!(
                    "{} listener on {}: closed a new connection from {peer}: {why}; raise it in [limits] if this is legitimate{more}",
                    self.role,
                    self.local
                );
            } else {
                c.unlogged += 1;
            }
            return None;
        }
        c.total += 1;
        *c.by_ip.entry(ip).or_insert(0) += 1;
        Some(Permit {
            gauge: self.clone(),
            ip,
        })
    }
}

/// One open connection's place under the caps; freed on drop.
struct Permit {
    gauge: Arc<Gauge>,
    ip: IpAddr,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut c = self.gauge.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                c.by_ip.remove(&self.ip);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connections.

/// An accepted TCP connection holding its place under the listener's caps.
pub struct Conn {
    tcp: TcpStream,
    _permit: Permit,
}

impl Conn {
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.peer_addr()
    }
}

/// `AsyncWrite` passed straight through to a field: the wrappers here only change reading.
macro_rules! write_through {
    (impl $([$($g:tt)*])? for $ty:ty, $field:ident) => {
        impl $(<$($g)*>)? AsyncWrite for $ty {
            fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.$field).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.$field).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.$field.is_write_vectored()
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.$field).poll_flush(cx)
            }

            fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.$field).poll_shutdown(cx)
            }
        }
    };
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.tcp).poll_read(cx, buf)
    }
}

write_through!(impl for Conn, tcp);

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo {
            local_addr: self.tcp.local_addr().ok(),
            remote_addr: self.tcp.peer_addr().ok(),
        }
    }
}

/// A stream whose first bytes (the HTTP/2 preface, already read and checked) are served again
/// before the rest.
pub struct Prefaced<IO> {
    io: IO,
    replayed: usize,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefaced<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.replayed < PREFACE.len() {
            let rest = &PREFACE[self.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            self.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

write_through!(impl[IO: AsyncWrite + Unpin] for Prefaced<IO>, io);

impl<IO: Connected> Connected for Prefaced<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> IO::ConnectInfo {
        self.io.connect_info()
    }
}

/// Reads the HTTP/2 preface, closing at the first byte that does not belong to it.
async fn read_preface<IO: AsyncRead + Unpin>(mut io: IO) -> io::Result<Prefaced<IO>> {
    let mut got = [0u8; PREFACE.len()];
    let mut n = 0;
    while n < PREFACE.len() {
        let k = io.read(&mut got[n..]).await?;
        if k == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "closed before the HTTP/2 preface",
            ));
        }
        if got[n..n + k] != PREFACE[n..n + k] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an HTTP/2 connection preface (this port speaks gRPC)",
            ));
        }
        n += k;
    }
    Ok(Prefaced { io, replayed: 0 })
}

// ---------------------------------------------------------------------------------------------
// Accepting.

/// Socket options of every accepted connection.
fn tune(tcp: &TcpStream, limits: &Limits) {
    // Small request/response messages: do not wait for Nagle.
    let _ = tcp.set_nodelay(true);
    let idle = Duration::from_millis(limits.keepalive_interval_ms);
    let ka = socket2::TcpKeepalive::new().with_time(idle).with_interval(idle);
    let sock = socket2::SockRef::from(tcp);
    if let Err(e) = sock.set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "cannot set TCP keep-alive");
    }
    let unacked = Duration::from_millis(limits.keepalive_timeout_ms);
    if let Err(e) = sock.set_tcp_user_timeout(Some(unacked)) {
        tracing::debug!(error = %e, "cannot set TCP_USER_TIMEOUT");
    }
}

/// Accepts until `closed` resolves; every connection under the caps goes to `each` (spawned).
async fn accept_loop<F, Fut>(
    listener: TcpListener,
    limits: Limits,
    role: &'static str,
    closed: impl Future<Output = ()>,
    each: F,
) where
    F: Fn(Conn, SocketAddr) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let local = listener
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let gauge = Gauge::new(role, local, &limits);
    tokio::pin!(closed);
    loop {
        let accepted = tokio::select! {
            _ = &mut closed => return,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: say so, and do not spin.
                tracing::warn!(%role, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(permit) = gauge.admit(peer) else {
            continue;
        };
        tune(&tcp, &limits);
        tokio::spawn(each(Conn { tcp, _permit: permit }, peer));
    }
}

/// The accepted, handshaken connections of a gRPC listener, for [`serve_grpc`]: plaintext or
/// TLS (two types, because tonic learns the peer's certificate from its `TlsStream`).
pub enum Incoming {
    Plain(ReceiverStream<io::Result<Prefaced<Conn>>>),
    Tls(ReceiverStream<io::Result<Prefaced<TlsStream<Conn>>>>),
}

impl Incoming {
    /// Accepts on `listener` in the background (until this is dropped) with the caps and
    /// timeouts of `limits`; `tls` from [`crate::tls::ServerTls::rustls_config`].
    pub fn grpc(
        listener: TcpListener,
        tls: Option<Arc<ServerConfig>>,
        limits: &Limits,
        role: &'static str,
    ) -> Incoming {
        match tls {
            None => Incoming::Plain(handshaken(listener, limits, role, "HTTP/2 preface", read_preface)),
            Some(cfg) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                let handshake = move |conn| {
                    let acceptor = acceptor.clone();
                    async move { read_preface(acceptor.accept(conn).await?).await }
                };
                Incoming::Tls(handshaken(
                    listener,
                    limits,
                    role,
                    "TLS handshake and HTTP/2 preface",
                    handshake,
                ))
            }
        }
    }
}

/// Accepts on `listener` in the background (until the stream is dropped) and passes on each
/// connection whose `handshake` finishes within the handshake timeout of `limits`; `what`
/// names the handshake in the debug log of a connection closed for failing it or being late.
fn handshaken<IO, H, Fut>(
    listener: TcpListener,
    limits: &Limits,
    role: &'static str,
    what: &'static str,
    handshake: H,
) -> ReceiverStream<io::Result<Prefaced<IO>>>
where
    IO: Send + 'static,
    H: Fn(Conn) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = io::Result<Prefaced<IO>>> + Send + 'static,
{
    let timeout = Duration::from_millis(limits.handshake_timeout_ms);
    let (tx, rx) = mpsc::channel(HANDSHAKEN_QUEUE);
    let closed = tx.clone();
    tokio::spawn(accept_loop(
        listener,
        limits.clone(),
        role,
        async move { closed.closed().await },
        move |conn, peer| {
            let tx = tx.clone();
            let handshake = handshake(conn);
            async move {
                match tokio::time::timeout(timeout, handshake).await {
                    Ok(Ok(io)) => {
                        let _ = tx.send(Ok(io)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%role, %peer, error = %e, "{what} failed; connection closed")
                    }
                    Err(_) => {
                        tracing::debug!(%role, %peer, "no {what} within {timeout:?}; connection closed")
                    }
                }
            }
        },
    ));
    ReceiverStream::new(rx)
}

/// A tonic server with the HTTP/2 PINGs of `limits` (one after
/// [`Limits::http2_ping_interval_ms`] with nothing received, none when 0; no answer within
/// [`Limits::keepalive_timeout_ms`] closes the connection). Add layers, then [`serve_grpc`]
/// with the role's [`Services`].
pub fn grpc_server(limits: &Limits) -> tonic::transport::Server {
    let ping =
        (limits.http2_ping_interval_ms > 0).then(|| Duration::from_millis(limits.http2_ping_interval_ms));
    tonic::transport::Server::builder()
        .http2_keepalive_interval(ping)
        .http2_keepalive_timeout(Some(Duration::from_millis(limits.keepalive_timeout_ms)))
}

/// The gRPC services of a role, each recorded by its name, so [`serve_grpc`] answers health
/// and reflection for exactly them: a role adds its services here and nothing else.
#[derive(Default)]
pub struct Services {
    routes: tonic::service::Routes,
    names: Vec<&'static str>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Services").field("names", &self.names).finish()
    }
}

impl Services {
    pub fn new() -> Services {
        Services::default()
    }

    /// Adds a generated tonic server (`FooServer::new(..)`).
    pub fn add_service<S>(mut self, svc: S) -> Services
    where
        S: Service<Request<tonic::body::Body>, Response = Response<tonic::body::Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.names.push(S::NAME);
        self.routes = self.routes.add_service(svc);
        self
    }

    /// The full names of the services added (`gma.v1.Producer`), in order.
    pub fn names(&self) -> &[&'static str] {
        &self.names
    }
}

/// The standard services every gRPC listener serves beside the role's own ([`serve_grpc`]):
/// health (`grpc.health.v1`) and server reflection (v1 and v1alpha).
pub const STANDARD_SERVICES: [&str; 3] = [
    tonic_health::pb::health_server::SERVICE_NAME,
    tonic_reflection::pb::v1::server_reflection_server::SERVICE_NAME,
    tonic_reflection::pb::v1alpha::server_reflection_server::SERVICE_NAME,
];

/// The encoded descriptor sets of [`STANDARD_SERVICES`] (the door census enumerates their
/// RPCs; reflection serves them).
pub const STANDARD_DESCRIPTOR_SETS: [&[u8]; 3] = [
    tonic_health::pb::FILE_DESCRIPTOR_SET,
    tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
    tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
];

/// The doors of [`STANDARD_SERVICES`], served by every gRPC role to anyone its listener's TLS
/// admits: they carry no data (docs/security.md).
pub const DOORS: &[crate::authz::Door] = &[
    crate::authz::Door::open(
        "/grpc.health.v1.Health/Check",
        "served (no data): SERVING or NOT_SERVING for a service of the role, or \"\" for the server",
    ),
    crate::authz::Door::open(
        "/grpc.health.v1.Health/Watch",
        "served (no data): the serving status of a service of the role, as it changes",
    ),
    crate::authz::Door::open(
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "served (no data): the names and .proto descriptors of the role's services",
    ),
    crate::authz::Door::open(
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "served (no data): the names and .proto descriptors of the role's services",
    ),
];

/// The reflection services (v1, v1alpha) listing `names` and [`STANDARD_SERVICES`], with the
/// descriptors of every `.proto` of the fabric (`gma_proto::FILE_DESCRIPTOR_SET`) and of the
/// standard services.
#[allow(clippy::type_complexity)]
pub fn reflection(
    names: &[&str],
) -> Result<
    (
        tonic_reflection::pb::v1::server_reflection_server::ServerReflectionServer<
            impl tonic_reflection::pb::v1::server_reflection_server::ServerReflection,
        >,
        tonic_reflection::pb::v1alpha::server_reflection_server::ServerReflectionServer<
            impl tonic_reflection::pb::v1alpha::server_reflection_server::ServerReflection,
        >,
    ),
    tonic_reflection::server::Error,
> {
    let builder = || {
        let mut b = tonic_reflection::server::Builder::configure()
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(gma_proto::FILE_DESCRIPTOR_SET);
        for set in STANDARD_DESCRIPTOR_SETS {
            b = b.register_encoded_file_descriptor_set(set);
        }
        for name in names.iter().copied().chain(STANDARD_SERVICES) {
            b = b.with_service_name(name);
        }
        b
    };
    Ok((builder().build_v1()?, builder().build_v1alpha()?))
}

/// A gRPC service made by `make` on its first request and kept (`None`: it could not be made;
/// its requests get INTERNAL).
struct Lazy<S> {
    make: Arc<dyn Fn() -> Option<S> + Send + Sync>,
    made: Arc<std::sync::OnceLock<Option<S>>>,
}

impl<S> Lazy<S> {
    fn new(make: impl Fn() -> Option<S> + Send + Sync + 'static) -> Lazy<S> {
        Lazy {
            make: Arc::new(make),
            made: Arc::default(),
        }
    }
}

impl<S> Lazy<S> {
    /// A reflection service of `names` (`pick` builds it from them).
    fn reflection(
        names: Arc<[&'static str]>,
        pick: impl Fn(&[&str]) -> Result<S, tonic_reflection::server::Error> + Send + Sync + 'static,
    ) -> Lazy<S> {
        // Not failing: the descriptor sets are compiled in (tested below).
        Lazy::new(move || {
            pick(&names)
                .inspect_err(|e| tracing::error!(error = %e, "gRPC reflection not served: the descriptor sets do not load"))
                .ok()
        })
    }
}

impl<S> Clone for Lazy<S> {
    fn clone(&self) -> Self {
        Lazy {
            make: self.make.clone(),
            made: self.made.clone(),
        }
    }
}

impl<S: NamedService> NamedService for Lazy<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<Request<tonic::body::Body>> for Lazy<S>
where
    S: Service<Request<tonic::body::Body>, Response = Response<tonic::body::Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        match self.made.get_or_init(|| (self.make)()) {
            // The generated servers are always ready.
            Some(s) => Box::pin(s.clone().call(req)),
            None => {
                let status = tonic::Status::internal("server reflection is not available on this server");
                Box::pin(std::future::ready(Ok(status.into_http())))
            }
        }
    }
}

/// Serves `services` on `incoming` with the layers of `server` (from [`grpc_server`]) until
/// `signal` resolves, then stops accepting and drains.
///
/// Beside the role's services, every listener answers the standard health service
/// (`grpc.health.v1.Health`: SERVING for each of `services` and for the server, `""`, until
/// `signal`; then NOT_SERVING, and open `Watch` streams end so they do not hold the drain) and
/// server reflection (v1 and v1alpha, listing the role's services), so `grpcurl list`,
/// `grpcurl describe` and `grpc_health_probe` work without the .proto files.
pub async fn serve_grpc<L, ResBody>(
    mut server: tonic::transport::Server<L>,
    services: Services,
    incoming: Incoming,
    signal: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    L: Layer<tonic::service::Routes> + Clone,
    L::Service: Service<Request<tonic::body::Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    <<L as Layer<tonic::service::Routes>>::Service as Service<Request<tonic::body::Body>>>::Future: Send,
    <<L as Layer<tonic::service::Routes>>::Service as Service<Request<tonic::body::Body>>>::Error:
        Into<BoxError> + Send,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    use tonic_health::ServingStatus;
    let Services { mut routes, names } = services;
    let (mut reporter, health) = tonic_health::server::health_reporter();
    for name in &names {
        reporter.set_service_status(name, ServingStatus::Serving).await;
    }
    routes = routes.add_service(health);
    // Built on their first request: their tables are ~0.5 MiB of every process's heap
    // (docs/PERFORMANCE.md, the agent's memory) and most processes are never asked.
    let shared: Arc<[&'static str]> = names.clone().into();
    routes = routes
        .add_service(Lazy::reflection(shared.clone(), |n| reflection(n).map(|r| r.0)))
        .add_service(Lazy::reflection(shared, |n| reflection(n).map(|r| r.1)));
    let signal = async move {
        signal.await;
        for name in names.iter().copied().chain([""]) {
            reporter.set_service_status(name, ServingStatus::NotServing).await;
            // Dropping the status ends the Watch streams after they got NOT_SERVING.
            reporter.clear_service_status(name).await;
        }
    };
    let router = server.add_routes(routes);
    match incoming {
        Incoming::Plain(s) => router.serve_with_incoming_shutdown(s, signal).await,
        Incoming::Tls(s) => router.serve_with_incoming_shutdown(s, signal).await,
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.

/// Who sent an HTTP request served by [`serve_http`] (a request extension): the peer's
/// address and, over TLS with client certificates, the identity (subject CN and O, as
/// [`crate::authz::identity_from_der`] reads it for the gRPC roles) of its certificate,
/// which the handshake verified against the listener's client CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub addr: SocketAddr,
    pub cert: Option<crate::authz::Identity>,
}

impl Peer {
    /// The identity of the peer: its certificate's subject, or anonymous.
    pub fn identity(&self) -> crate::authz::Identity {
        self.cert
            .clone()
            .unwrap_or_else(crate::authz::Identity::anonymous)
    }
}

/// The identity of the verified client certificate of a TLS connection, if it presented one
/// with a usable subject.
fn cert_identity<IO>(tls: &TlsStream<IO>) -> Option<crate::authz::Identity> {
    let der = tls.get_ref().1.peer_certificates()?.first()?;
    match crate::authz::identity_from_der(der.as_ref()) {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::debug!(error = %e, "client certificate without a usable subject");
            None
        }
    }
}

/// Puts the [`Peer`] into every request's extensions.
#[derive(Clone)]
struct WithPeer<S> {
    inner: S,
    peer: Peer,
}

impl<S, B> Service<Request<B>> for WithPeer<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        req.extensions_mut().insert(self.peer.clone());
        self.inner.call(req)
    }
}

/// Serves `service` (an axum `Router`, or any tower service of HTTP requests) over HTTP/1.1 on
/// `listener` — TLS when `tls` is given — with the caps and timeouts of `limits`, until
/// `shutdown` resolves; then stops accepting, asks every connection to finish its request
/// and close, and waits for them (at most 5 s). Each request carries a [`Peer`].
pub async fn serve_http<S, B>(
    listener: TcpListener,
    tls: Option<Arc<ServerConfig>>,
    service: S,
    limits: &Limits,
    role: &'static str,
    shutdown: impl Future<Output = ()>,
) where
    S: Service<Request<hyper::body::Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: HttpBody + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Every connection task holds a clone; all dropped = all closed.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    let handshake = Duration::from_millis(limits.handshake_timeout_ms);
    let header = Duration::from_millis(limits.header_read_timeout_ms);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let each = {
        let open_tx = open_tx.clone();
        move |conn: Conn, peer: SocketAddr| {
            let (service, acceptor, stop, open) = (
                service.clone(),
                acceptor.clone(),
                stop_rx.clone(),
                open_tx.clone(),
            );
            async move {
                let _open = open;
                match acceptor {
                    None => {
                        let p = Peer {
                            addr: peer,
                            cert: None,
                        };
                        serve_http_conn(conn, service, p, header, stop).await
                    }
                    Some(acceptor) => match tokio::time::timeout(handshake, acceptor.accept(conn)).await {
                        Ok(Ok(tls)) => {
                            let p = Peer {
                                addr: peer,
                                cert: cert_identity(&tls),
                            };
                            serve_http_conn(tls, service, p, header, stop).await
                        }
                        Ok(Err(e)) => tracing::debug!(%role, %peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(
                            %role, %peer, "no TLS handshake within {handshake:?}; connection closed"
                        ),
                    },
                }
            }
        }
    };
    accept_loop(listener, limits.clone(), role, shutdown, each).await;
    let _ = stop_tx.send(true);
    drop(open_tx);
    if tokio::time::timeout(Duration::from_secs(5), open_rx.recv())
        .await
        .is_err()
    {
        tracing::warn!(%role, "connections still open 5 s after shutdown; leaving them");
    }
}

async fn serve_http_conn<IO, S, B>(
    io: IO,
    service: S,
    peer: Peer,
    header_timeout: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Service<Request<hyper::body::Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: HttpBody + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let addr = peer.addr;
    let svc = hyper_util::service::TowerToHyperService::new(WithPeer { inner: service, peer });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true)
        .serve_connection(hyper_util::rt::TokioIo::new(io), svc);
    tokio::pin!(conn);
    let done = tokio::select! {
        r = conn.as_mut() => Some(r),
        _ = stop.wait_for(|s| *s) => None,
    };
    let r = match done {
        Some(r) => r,
        None => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = r {
        tracing::debug!(peer = %addr, error = %e, "HTTP connection ended");
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A lazy service is made on its first request only, once, and a failed make answers
    /// INTERNAL.
    #[tokio::test]
    async fn a_lazy_service_is_made_on_its_first_request_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        #[derive(Clone)]
        struct Ok200;
        impl Service<Request<tonic::body::Body>> for Ok200 {
            type Response = Response<tonic::body::Body>;
            type Error = Infallible;
            type Future = std::future::Ready<Result<Self::Response, Infallible>>;
            fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
                Poll::Ready(Ok(()))
            }
            fn call(&mut self, _req: Request<tonic::body::Body>) -> Self::Future {
                std::future::ready(Ok(Response::new(tonic::body::Body::default())))
            }
        }
        let made = Arc::new(AtomicUsize::new(0));
        let counted = made.clone();
        let mut lazy = Lazy::new(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            Some(Ok200)
        });
        let mut other = lazy.clone();
        assert_eq!(made.load(Ordering::Relaxed), 0, "made before any request");
        let req = || Request::new(tonic::body::Body::default());
        assert!(lazy.call(req()).await.is_ok());
        assert!(other.call(req()).await.is_ok());
        assert_eq!(made.load(Ordering::Relaxed), 1, "made once, shared by the clones");

        let mut failed: Lazy<Ok200> = Lazy::new(|| None);
        let resp = failed.call(req()).await.unwrap();
        let status = tonic::Status::from_header_map(resp.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::Internal);
    }

    /// The reflection services build from the compiled-in descriptor sets (what serve_grpc
    /// relies on), and every service a role may name is in them.
    #[test]
    fn reflection_builds_from_the_compiled_in_descriptor_sets() {
        let names: Vec<&str> = gma_proto::rpcs()
            .unwrap()
            .iter()
            .filter_map(|r| {
                r.path
                    .rsplit_once('/')
                    .map(|(s, _)| s.trim_start_matches('/').to_string())
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .map(|s| &*s.leak())
            .collect();
        assert!(names.contains(&"gma.v1.Producer") && names.contains(&"gma.raft.v1.Raft"));
        assert!(reflection(&names).is_ok());
        // Every standard service has its descriptors, and a door.
        for (name, set) in STANDARD_SERVICES.iter().zip(STANDARD_DESCRIPTOR_SETS) {
            let rpcs = gma_proto::rpcs_of(set).unwrap();
            assert!(!rpcs.is_empty());
            for r in rpcs {
                assert!(
                    r.path.starts_with(&format!("/{name}/")),
                    "{} in {name}'s set",
                    r.path
                );
                assert!(DOORS.iter().any(|d| d.door == r.path), "{} has no door", r.path);
            }
        }
    }

    /// A role's services are recorded by name, in order.
    #[test]
    fn services_record_the_names_of_what_is_added() {
        let (_, health) = tonic_health::server::health_reporter();
        let s = Services::new().add_service(health);
        assert_eq!(s.names(), ["grpc.health.v1.Health"]);
    }

    fn limits(max: usize, per_address: usize) -> Limits {
        Limits {
            max_connections: max,
            max_connections_per_address: per_address,
            ..Limits::default()
        }
    }

    #[test]
    fn caps_per_listener_and_per_address_free_on_drop() {
        let g = Gauge::new("test", "127.0.0.1:1".parse().unwrap(), &limits(3, 2));
        let a: SocketAddr = "10.0.0.1:1000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1000".parse().unwrap();
        let p1 = g.admit(a).unwrap();
        let _p2 = g.admit(a).unwrap();
        assert!(g.admit(a).is_none(), "third from one address");
        let _p3 = g.admit(b).unwrap();
        assert!(g.admit(b).is_none(), "over the listener's cap");
        drop(p1);
        assert!(g.admit(a).is_some());
    }

    /// Every accepted socket carries the kernel's dead-peer detection of `limits`.
    #[tokio::test]
    async fn accepted_sockets_get_keepalive_and_a_user_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        let limits = Limits {
            keepalive_interval_ms: 7_000,
            keepalive_timeout_ms: 3_500,
            ..Limits::default()
        };
        tune(&tcp, &limits);
        let s = socket2::SockRef::from(&tcp);
        assert!(s.keepalive().unwrap() && tcp.nodelay().unwrap());
        assert_eq!(s.tcp_keepalive_time().unwrap(), Duration::from_secs(7));
        assert_eq!(s.tcp_keepalive_interval().unwrap(), Duration::from_secs(7));
        assert_eq!(s.tcp_user_timeout().unwrap(), Some(Duration::from_millis(3_500)));
    }

    #[test]
    fn the_ping_interval_is_zero_or_at_least_a_second() {
        let with = |ms| Limits {
            http2_ping_interval_ms: ms,
            ..Limits::default()
        };
        assert!(with(0).validate().is_ok() && with(1_000).validate().is_ok());
        let e = with(999).validate().unwrap_err().to_string();
        assert!(e.contains("limits.http2_ping_interval_ms"), "{e}");
        assert!(with(86_400_001).validate().is_err());
    }

    /// A gRPC peer that sends nothing gets an HTTP/2 PING after `http2_ping_interval_ms`, and
    /// when it does not answer, the connection is closed.
    #[tokio::test]
    async fn an_unanswered_ping_closes_the_connection() {
        let limits = Limits {
            http2_ping_interval_ms: 1_000,
            keepalive_timeout_ms: 300,
            ..Limits::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = Incoming::grpc(listener, None, &limits, "test");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve_grpc(
            grpc_server(&limits),
            Services::new(),
            incoming,
            async move {
                let _ = stopped.await;
            },
        ));
        let mut peer = TcpStream::connect(addr).await.unwrap();
        peer.write_all(PREFACE).await.unwrap();
        // An empty SETTINGS frame (length 0, type 4, no flags, stream 0), then silence.
        peer.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        let frames = async {
            let mut types = Vec::new();
            let mut head = [0u8; 9];
            while peer.read_exact(&mut head).await.is_ok() {
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let mut payload = vec![0u8; len];
                if peer.read_exact(&mut payload).await.is_err() {
                    break;
                }
                types.push((head[3], head[4]));
            }
            types
        };
        let types = tokio::time::timeout(Duration::from_secs(60), frames)
            .await
            .expect("the server closes a connection whose PING goes unanswered");
        assert!(
            types.contains(&(6, 0)),
            "a PING (type 6, not an ACK) before the close: {types:?}"
        );
        let _ = stop.send(());
        server.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn the_preface_is_checked_and_replayed() {
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(PREFACE).await.unwrap();
        client.write_all(b"rest").await.unwrap();
        let mut p = read_preface(server).await.unwrap();
        let mut got = vec![0u8; 28];
        p.read_exact(&mut got).await.unwrap();
        assert_eq!(&got[..24], PREFACE);
        assert_eq!(&got[24..], b"rest");
        let (mut client, server) = tokio::io::duplex(64);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let e = read_preface(server).await.err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
