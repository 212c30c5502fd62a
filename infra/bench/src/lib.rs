//! Shared by the benchmark tools: a minimal HTTP/1.1 client on hyper and
//! percentile arithmetic.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// One keep-alive connection.
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
    authority: String,
}

impl Connection {
    pub async fn open(authority: &str) -> Connection {
        let stream = TcpStream::connect(authority).await.expect("connect");
        stream.set_nodelay(true).unwrap();
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
        tokio::spawn(connection);
        Connection { sender, authority: authority.to_owned() }
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, Bytes) {
        let mut request = http::Request::builder().method(method).uri(path).header("host", &self.authority);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default().to_owned()))).unwrap();
        self.sender.ready().await.expect("connection ready");
        let response = self.sender.send_request(request).await.expect("response");
        let status = response.status().as_u16();
        (status, response.into_body().collect().await.expect("body").to_bytes())
    }
}

/// The `p`-th percentile (0 to 100) of sorted samples, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

pub fn millis(duration: Duration) -> String {
    format!("{:.2} ms", duration.as_secs_f64() * 1_000.0)
}
