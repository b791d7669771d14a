//! File names of keys: every string key maps to one safe file name and back.

/// Percent-encode `key` into a file name: ASCII letters, digits, `-` and `_` stay,
/// every other byte becomes `%XX`.
pub(super) fn encode_key(key: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The key of a file name written by [`encode_key`]; `None` for any other name.
pub(super) fn decode_key(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let key = String::from_utf8(out).ok()?;
    // Only the canonical spelling counts, so two files can never claim one key.
    (encode_key(&key) == name).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_encoding_round_trips_and_rejects_foreign_names() {
        for key in ["a/generate/1", "v1/instances/ns.x/ép", "%41", "..", "-_"] {
            let name = encode_key(key);
            assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
            assert_eq!(decode_key(&name).as_deref(), Some(key));
        }
        assert_eq!(decode_key("%2f"), None, "lower-case hex is not canonical");
        assert_eq!(decode_key("%+1"), None);
        assert_eq!(decode_key(".tmp-1-2"), None);
        assert_eq!(decode_key("%"), None);
    }
}
