//! The wire frame shared by every TCP connection of the runtime (see `docs/wire-protocol.md`).
//!
//! ```text
//! u32  length of everything after this field (big-endian)
//! u8   kind
//! u64  stream id (big-endian)
//! u32  header length (big-endian)
//! ...  header (JSON or empty)
//! ...  body (opaque bytes, usually JSON)
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{Error, ErrorKind, Result};

/// Bytes of the fixed part after the length prefix: kind, stream id, header length.
pub(crate) const FIXED_LEN: usize = 1 + 8 + 4;
/// Bytes of the length prefix.
pub(crate) const LENGTH_PREFIX: usize = 4;
/// Protocol version sent in [`FrameKind::Hello`].
/// Version 2 added Ping and Pong; version 3 added SubscribeSync and Subscribed. A peer of
/// an older version would close the connection on them.
pub(crate) const PROTOCOL_VERSION: u32 = 3;

/// What a frame means. The numbers are the wire values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// First frame of a connection: header `{"version":3,"instance_id":N}`.
    Hello = 1,
    /// A request for an endpoint: header `{"endpoint":"ns/comp/ep","id":"..."}`, body = payload.
    Request = 2,
    /// The worker took the stream (NATS plane: binds the stream to this connection).
    Start = 3,
    /// One response item: header = optional annotations JSON, body = data JSON.
    Item = 4,
    /// The stream finished normally.
    End = 5,
    /// The stream failed: header `{"kind":"...","message":"..."}`. Ends the stream.
    Error = 6,
    /// Caller asks the worker to stop generating (graceful).
    Stop = 7,
    /// Caller abandons the stream (the worker drops it at once).
    Kill = 8,
    /// Event subscription: stream id = subscription id, header `{"subject":"..."}`.
    Subscribe = 9,
    /// Event: stream id = subscription id, header = subject, body = payload.
    Event = 10,
    /// Liveness probe (stream 0): the peer's connection reader answers Pong at once.
    Ping = 11,
    /// Answer to a Ping (stream 0).
    Pong = 12,
    /// Subscriber → publisher, after its Subscribe frames: stream id = a sync token. The
    /// publisher has every earlier subscription of this connection once it reads it.
    SubscribeSync = 13,
    /// Publisher → subscriber: the answer to SubscribeSync, same stream id (the token).
    Subscribed = 14,
}

impl FrameKind {
    fn from_u8(v: u8) -> Option<FrameKind> {
        Some(match v {
            1 => FrameKind::Hello,
            2 => FrameKind::Request,
            3 => FrameKind::Start,
            4 => FrameKind::Item,
            5 => FrameKind::End,
            6 => FrameKind::Error,
            7 => FrameKind::Stop,
            8 => FrameKind::Kill,
            9 => FrameKind::Subscribe,
            10 => FrameKind::Event,
            11 => FrameKind::Ping,
            12 => FrameKind::Pong,
            13 => FrameKind::SubscribeSync,
            14 => FrameKind::Subscribed,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What the frame means.
    pub kind: FrameKind,
    /// The stream (or subscription) it belongs to; 0 for connection-level frames.
    pub stream: u64,
    /// Kind-specific metadata, usually JSON; may be empty.
    pub header: Bytes,
    /// The payload; may be empty.
    pub body: Bytes,
}

impl Frame {
    /// A frame with no header.
    pub fn new(kind: FrameKind, stream: u64, body: Bytes) -> Self {
        Frame { kind, stream, header: Bytes::new(), body }
    }

    /// A frame with a header and a body.
    pub fn with_header(kind: FrameKind, stream: u64, header: Bytes, body: Bytes) -> Self {
        Frame { kind, stream, header, body }
    }

    /// A frame carrying no data, only its kind (End, Stop, Kill, Start).
    pub fn control(kind: FrameKind, stream: u64) -> Self {
        Frame { kind, stream, header: Bytes::new(), body: Bytes::new() }
    }

    /// Size on the wire, length prefix included.
    pub fn encoded_len(&self) -> usize {
        LENGTH_PREFIX + FIXED_LEN + self.header.len() + self.body.len()
    }

    /// Append the encoded frame to `dst`.
    pub fn encode(&self, dst: &mut BytesMut) {
        dst.reserve(self.encoded_len());
        dst.put_u32((FIXED_LEN + self.header.len() + self.body.len()) as u32);
        dst.put_u8(self.kind as u8);
        dst.put_u64(self.stream);
        dst.put_u32(self.header.len() as u32);
        dst.extend_from_slice(&self.header);
        dst.extend_from_slice(&self.body);
    }

    /// Encode into a fresh buffer.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(self.encoded_len());
        self.encode(&mut b);
        b.freeze()
    }

    /// Decode the part after the length prefix (as produced by a length-delimited reader).
    pub fn decode(mut src: Bytes) -> Result<Frame> {
        if src.len() < FIXED_LEN {
            return Err(protocol(format!("frame of {} bytes is shorter than its header", src.len())));
        }
        let raw_kind = src.get_u8();
        let kind =
            FrameKind::from_u8(raw_kind).ok_or_else(|| protocol(format!("unknown frame kind {raw_kind}")))?;
        let stream = src.get_u64();
        let header_len = src.get_u32() as usize;
        if header_len > src.len() {
            return Err(protocol(format!(
                "frame header length {header_len} exceeds the {} bytes left",
                src.len()
            )));
        }
        let header = src.split_to(header_len);
        Ok(Frame { kind, stream, header, body: src })
    }

    /// Decode a complete frame including its length prefix (NATS messages carry these).
    pub fn decode_prefixed(mut src: Bytes) -> Result<Frame> {
        if src.len() < LENGTH_PREFIX {
            return Err(protocol("message shorter than a frame length prefix"));
        }
        let len = src.get_u32() as usize;
        if len != src.len() {
            return Err(protocol(format!("frame says {len} bytes but {} arrived", src.len())));
        }
        Frame::decode(src)
    }
}

fn protocol(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Protocol, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let f = Frame::with_header(
            FrameKind::Request,
            42,
            Bytes::from_static(br#"{"endpoint":"a/b/c"}"#),
            Bytes::from_static(b"[1,2,3]"),
        );
        let bytes = f.to_bytes();
        assert_eq!(bytes.len(), f.encoded_len());
        assert_eq!(Frame::decode_prefixed(bytes.clone()).unwrap(), f);
        assert_eq!(Frame::decode(bytes.slice(LENGTH_PREFIX..)).unwrap(), f);
    }

    #[test]
    fn ping_and_pong_are_connection_level() {
        for kind in [FrameKind::Ping, FrameKind::Pong] {
            let f = Frame::control(kind, 0);
            assert_eq!(Frame::decode_prefixed(f.to_bytes()).unwrap(), f);
        }
        assert_eq!(FrameKind::from_u8(11), Some(FrameKind::Ping));
        assert_eq!(FrameKind::from_u8(12), Some(FrameKind::Pong));
    }

    #[test]
    fn rejects_garbage() {
        assert_eq!(Frame::decode(Bytes::from_static(b"abc")).unwrap_err().kind(), ErrorKind::Protocol);
        let mut bad = BytesMut::new();
        bad.put_u8(99);
        bad.put_u64(1);
        bad.put_u32(0);
        assert!(Frame::decode(bad.freeze()).unwrap_err().to_string().contains("unknown frame kind 99"));
        let mut short = BytesMut::new();
        short.put_u8(FrameKind::Item as u8);
        short.put_u64(1);
        short.put_u32(100);
        assert!(Frame::decode(short.freeze()).is_err());
    }
}
