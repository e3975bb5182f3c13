//! Endpoint addresses: `host:port` for listeners, `http://host:port` for clients.

use std::net::SocketAddr;

/// Turns `127.0.0.1:7000` or `http://127.0.0.1:7000` into a client endpoint URI.
pub fn endpoint_uri(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

/// The address a listener advertises: the bound address, with an unspecified IP (0.0.0.0)
/// replaced by loopback so the advertised address is one a peer on this host can dial.
pub fn advertised(bound: SocketAddr) -> String {
    let ip = if bound.ip().is_unspecified() {
        match bound {
            SocketAddr::V4(_) => "127.0.0.1".to_string(),
            SocketAddr::V6(_) => "[::1]".to_string(),
        }
    } else {
        match bound {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        }
    };
    format!("http://{ip}:{}", bound.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris() {
        assert_eq!(endpoint_uri("127.0.0.1:1"), "http://127.0.0.1:1");
        assert_eq!(endpoint_uri("http://x:1"), "http://x:1");
        assert_eq!(advertised("0.0.0.0:5".parse().unwrap()), "http://127.0.0.1:5");
        assert_eq!(advertised("127.0.0.1:5".parse().unwrap()), "http://127.0.0.1:5");
    }
}
