//! Byte counts of a channel's own sockets: a connector for
//! [`tonic::transport::Endpoint::connect_with_connector`] that opens the TCP connection itself
//! and counts every byte read from and written to it (everything gRPC, HTTP/2 and, when on,
//! TLS put on the socket), into counters the caller holds.
//!
//! What it costs: one relaxed atomic add per read or write call on the socket (per HTTP/2
//! read of up to a buffer's worth, not per event or frame). The benches use it to book the
//! bytes on a consumer's socket without a counting proxy in between (a hop of its own CPU).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::codegen::http::Uri;

/// Bytes read from and written to the sockets of the channels that share these counters.
#[derive(Debug, Clone, Default)]
pub struct SocketBytes {
    read: Arc<AtomicU64>,
    written: Arc<AtomicU64>,
}

impl SocketBytes {
    pub fn new() -> SocketBytes {
        SocketBytes::default()
    }

    /// Bytes read from the sockets so far (producer -> this side).
    pub fn read(&self) -> u64 {
        self.read.load(Ordering::Relaxed)
    }

    /// Bytes written to the sockets so far (this side -> producer).
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
}

/// A TCP stream whose reads and writes are counted into [`SocketBytes`].
pub struct CountedStream {
    inner: TcpStream,
    bytes: SocketBytes,
}

impl AsyncRead for CountedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.bytes.read.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.bytes.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = polled {
            self.bytes.written.fetch_add(n as u64, Ordering::Relaxed);
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Connects to the URI's host and port over TCP (no delay, as tonic's own connector sets it)
/// and hands back the stream counted into its [`SocketBytes`].
#[derive(Debug, Clone)]
pub struct CountingConnector {
    pub bytes: SocketBytes,
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<TokioIo<CountedStream>>> + Send>>;

impl tonic::codegen::Service<Uri> for CountingConnector {
    type Response = TokioIo<CountedStream>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let bytes = self.bytes.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
                Some("https") => 443,
                _ => 80,
            });
            let inner = TcpStream::connect((host, port)).await?;
            inner.set_nodelay(true)?;
            Ok(TokioIo::new(CountedStream { inner, bytes }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tonic::codegen::Service;

    #[tokio::test]
    async fn every_byte_each_way_is_counted() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let echo = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await?;
            let mut got = vec![0u8; 5];
            s.read_exact(&mut got).await?;
            s.write_all(b"0123456789").await?;
            Ok::<_, std::io::Error>(())
        });
        let mut connector = CountingConnector {
            bytes: SocketBytes::new(),
        };
        let uri: Uri = format!("http://{addr}").parse()?;
        let io = connector.call(uri).await?;
        let mut s = io.into_inner();
        s.write_all(b"hello").await?;
        let mut back = vec![0u8; 10];
        s.read_exact(&mut back).await?;
        echo.await??;
        assert_eq!(connector.bytes.written(), 5);
        assert_eq!(connector.bytes.read(), 10);
        Ok(())
    }
}
