//! The chat templates' `tojson` filter, written to give the text Hugging Face's gives:
//! transformers' `tojson` is Python's `json.dumps(x, ensure_ascii=False, indent=None,
//! separators=None, sort_keys=False)` with those four keyword arguments open to the
//! template. Keys keep their order (minijinja and serde_json are built with
//! `preserve_order`), as a Python dict's do.

use std::io::{self, Write};

use minijinja::value::{Kwargs, Value};
use minijinja::{Error, ErrorKind};
use serde::Serialize;

/// `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`, as
/// transformers defines it; another keyword argument is an error, as in Python.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<usize> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let separators = match separators.as_deref() {
        None => None,
        Some([item, key]) => Some((item.as_str(), key.as_str())),
        Some(_) => return Err(failed("separators must be an (item, key) pair")),
    };
    let formatter = PythonFormatter::new(indent, separators, ensure_ascii.unwrap_or(false));
    let mut out = Vec::new();
    let result = if sort_keys.unwrap_or(false) {
        let mut json = serde_json::to_value(value).map_err(|e| failed(&e.to_string()))?;
        json.sort_all_objects();
        json.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))
    } else {
        value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, formatter))
    };
    result.map_err(|e| failed(&e.to_string()))?;
    let text = String::from_utf8(out).map_err(|e| failed(&e.to_string()))?;
    Ok(Value::from_safe_string(text))
}

fn failed(message: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {message}"))
}

/// Writes JSON as Python's `json.dumps` does: its separators (`", "` and `": "`, or
/// `","` and `": "` with an indent), its indentation, `\uXXXX` escapes for non-ASCII
/// text with `ensure_ascii`, and floats as Python's `repr` writes them.
struct PythonFormatter {
    item_separator: Vec<u8>,
    key_separator: Vec<u8>,
    indent: Option<Vec<u8>>,
    ensure_ascii: bool,
    depth: usize,
    has_value: bool,
}

impl PythonFormatter {
    fn new(indent: Option<usize>, separators: Option<(&str, &str)>, ensure_ascii: bool) -> Self {
        let (item, key) = separators.unwrap_or(if indent.is_some() { (",", ": ") } else { (", ", ": ") });
        PythonFormatter {
            item_separator: item.as_bytes().to_vec(),
            key_separator: key.as_bytes().to_vec(),
            indent: indent.map(|n| vec![b' '; n]),
            ensure_ascii,
            depth: 0,
            has_value: false,
        }
    }

    fn newline<W: ?Sized + Write>(&self, writer: &mut W) -> io::Result<()> {
        if let Some(indent) = &self.indent {
            writer.write_all(b"\n")?;
            for _ in 0..self.depth {
                writer.write_all(indent)?;
            }
        }
        Ok(())
    }

    fn begin<W: ?Sized + Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(bracket)
    }

    fn end<W: ?Sized + Write>(&mut self, writer: &mut W, bracket: &[u8]) -> io::Result<()> {
        self.depth -= 1;
        if self.has_value {
            self.newline(writer)?;
        }
        writer.write_all(bracket)
    }

    fn item<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if !first {
            writer.write_all(&self.item_separator)?;
        }
        self.newline(writer)
    }
}

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.begin(writer, b"[")
    }

    fn end_array<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.end(writer, b"]")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn end_array_value<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.begin(writer, b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        self.end(writer, b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        self.item(writer, first)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(&self.key_separator)
    }

    fn end_object_value<W: ?Sized + Write>(&mut self, _writer: &mut W) -> io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn write_f64<W: ?Sized + Write>(&mut self, writer: &mut W, value: f64) -> io::Result<()> {
        writer.write_all(python_float_repr(value).as_bytes())
    }

    fn write_string_fragment<W: ?Sized + Write>(&mut self, writer: &mut W, fragment: &str) -> io::Result<()> {
        if !self.ensure_ascii || fragment.is_ascii() {
            return writer.write_all(fragment.as_bytes());
        }
        let mut units = [0u16; 2];
        for c in fragment.chars() {
            if c.is_ascii() {
                writer.write_all(&[c as u8])?;
            } else {
                for unit in c.encode_utf16(&mut units) {
                    write!(writer, "\\u{unit:04x}")?;
                }
            }
        }
        Ok(())
    }
}

/// A finite float as Python's `repr` writes it: the shortest text that reads back
/// as the same value, in positional notation with at least one decimal (`1.0`,
/// `0.0001`) for decimal exponents -4 to 15, else in exponent notation with a sign
/// and at least two exponent digits (`1e+16`, `1.5e-07`).
fn python_float_repr(value: f64) -> String {
    // Rust's `{:e}` is the shortest round-trip text too: `1.5e-7`, `1e16`.
    let exponent_form = format!("{value:e}");
    let (mantissa, exponent) = exponent_form.split_once('e').unwrap_or((&exponent_form, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    if (-4..16).contains(&exponent) {
        let positional = format!("{value}");
        if positional.contains('.') {
            positional
        } else {
            format!("{positional}.0")
        }
    } else {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use minijinja::Environment;

    fn render(template: &str, value: serde_json::Value) -> String {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(template, minijinja::context! { x => value }).unwrap()
    }

    /// Every expected text below is what Python 3's `json.dumps` writes for the same
    /// value and arguments (transformers' `tojson`).
    #[test]
    fn writes_what_json_dumps_writes() {
        let x = serde_json::json!({"z": [1, 2.5, {}], "a": {"é": "日本\"\n", "b": []}, "n": null, "t": true});
        assert_eq!(render("{{ x | tojson }}", x.clone()),
            r#"{"z": [1, 2.5, {}], "a": {"é": "日本\"\n", "b": []}, "n": null, "t": true}"#);
        assert_eq!(render("{{ x | tojson(sort_keys=true) }}", x.clone()),
            r#"{"a": {"b": [], "é": "日本\"\n"}, "n": null, "t": true, "z": [1, 2.5, {}]}"#);
        assert_eq!(render("{{ x | tojson(ensure_ascii=true) }}", x.clone()),
            r#"{"z": [1, 2.5, {}], "a": {"\u00e9": "\u65e5\u672c\"\n", "b": []}, "n": null, "t": true}"#);
        assert_eq!(render("{{ x | tojson(separators=(',', ':')) }}", x.clone()),
            r#"{"z":[1,2.5,{}],"a":{"é":"日本\"\n","b":[]},"n":null,"t":true}"#);
        assert_eq!(render("{{ x | tojson(indent=2) }}", x),
            "{\n  \"z\": [\n    1,\n    2.5,\n    {}\n  ],\n  \"a\": {\n    \"é\": \"日本\\\"\\n\",\n    \"b\": []\n  },\n  \"n\": null,\n  \"t\": true\n}");
        // Outside the BMP: a surrogate pair, as Python writes it.
        assert_eq!(render("{{ x | tojson(ensure_ascii=true) }}", serde_json::json!("🙂")), r#""\ud83d\ude42""#);
        // HTML characters are not escaped (jinja's own tojson would).
        assert_eq!(render("{{ x | tojson }}", serde_json::json!("<a href='x'>&")), r#""<a href='x'>&""#);
    }

    #[test]
    fn floats_are_written_as_python_repr_writes_them() {
        let cases = [(1.0, "1.0"), (0.5, "0.5"), (1e-4, "0.0001"), (1e-5, "1e-05"), (1.5e-7, "1.5e-07"),
            (1e15, "1000000000000000.0"), (1e16, "1e+16"), (-2.5e100, "-2.5e+100"), (0.1, "0.1"),
            (123456.789, "123456.789")];
        for (value, python) in cases {
            assert_eq!(python_float_repr(value), python, "{value}");
        }
    }

    #[test]
    fn unknown_arguments_and_bad_separators_are_errors() {
        let mut env = Environment::new();
        env.add_filter("tojson", tojson);
        assert!(env.render_str("{{ 1 | tojson(cls=1) }}", ()).is_err());
        assert!(env.render_str("{{ 1 | tojson(separators=(',',)) }}", ()).is_err());
    }
}
