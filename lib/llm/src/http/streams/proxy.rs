//! Forwarding a resume or cancel to the frontend that owns the stream: one HTTP/1
//! connection per forwarded request (resumes are rare), its body streamed back as it
//! comes. The connection's task belongs to the registry.

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderValue, Method, Request};
use axum::response::Response;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::registry::StreamRegistry;
use super::routes::STREAM_FORWARDED_HEADER;

/// Bound on connecting to the owner and receiving its response head.
const FORWARD_BOUND: Duration = Duration::from_secs(5);

/// Why a forward failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("request: {0}")]
    Request(#[from] axum::http::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Percent-encode a request id for a URL path segment.
pub(crate) fn encode_segment(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Send `method path` to `owner` (`host:port`) and answer with its response.
pub(crate) async fn forward(
    registry: &StreamRegistry,
    owner: &str,
    method: Method,
    path: &str,
    authorization: Option<HeaderValue>,
) -> Result<Response, ForwardError> {
    let connect = async {
        let tcp = TcpStream::connect(owner).await.map_err(ForwardError::Connect)?;
        let _ = tcp.set_nodelay(true);
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
        Ok::<_, ForwardError>((sender, connection))
    };
    let (mut sender, connection) =
        tokio::time::timeout(FORWARD_BOUND, connect).await.map_err(|_| ForwardError::Timeout(FORWARD_BOUND))??;
    registry.track(|shutdown| async move {
        tokio::select! {
            result = connection => if let Err(e) = result {
                tracing::debug!(error = %e, "forwarded stream connection ended");
            },
            _ = shutdown.cancelled() => {}
        }
    });
    let mut request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, owner)
        .header(STREAM_FORWARDED_HEADER, "1");
    if let Some(value) = authorization {
        request = request.header(header::AUTHORIZATION, value);
    }
    let request = request.body(Body::empty())?;
    let response = tokio::time::timeout(FORWARD_BOUND, sender.send_request(request))
        .await
        .map_err(|_| ForwardError::Timeout(FORWARD_BOUND))??;
    Ok(response.map(Body::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_percent_encoded() {
        assert_eq!(encode_segment("abc-1_2.x~"), "abc-1_2.x~");
        assert_eq!(encode_segment("a/b c"), "a%2Fb%20c");
    }
}
