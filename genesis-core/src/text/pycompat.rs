//! What transformers' Jinja environment has and MiniJinja does not: its `tojson` (Python's
//! `json.dumps`), `strftime_now`, `raise_exception`, Python's spelling of `None`/`True` in
//! output, and the `{% generation %}` tag.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Error, ErrorKind, Output, State};
use std::fmt::Write;

/// `raise_exception(message)`: ends rendering with `message`.
pub(crate) fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Prints values as Jinja2 does: `None`, `True`, `False`; everything else as MiniJinja does.
pub(crate) fn format_value(out: &mut Output, state: &mut State, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.write_str("None").map_err(Error::from),
        ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }).map_err(Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// `x | tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`: Python's
/// `json.dumps` with those arguments, as transformers' chat template filter.
pub(crate) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_str(), v.as_i64()) {
            (Some(s), _) => Some(s.to_string()),
            (None, Some(n)) => Some(" ".repeat(n.max(0) as usize)),
            _ => return Err(Error::new(ErrorKind::InvalidOperation, "tojson: indent must be an integer or a string")),
        },
    };
    let (item_sep, key_sep) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<String> =
                v.try_iter()?.map(|p| p.as_str().map(str::to_string)).collect::<Option<_>>().unwrap_or_default();
            match <[String; 2]>::try_from(parts) {
                Ok([item, key]) => (item, key),
                Err(_) => {
                    return Err(Error::new(ErrorKind::InvalidOperation, "tojson: separators must be two strings"))
                }
            }
        }
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let mut writer = JsonWriter { out: String::new(), ensure_ascii, sort_keys, indent, item_sep, key_sep };
    writer.value(value, 0)?;
    Ok(Value::from_safe_string(writer.out))
}

struct JsonWriter {
    out: String,
    ensure_ascii: bool,
    sort_keys: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
}

impl JsonWriter {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number if value.is_integer() => self.out.push_str(&value.to_string()),
            ValueKind::Number => self.out.push_str(&py_float(f64::try_from(value.clone())?)),
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.separator(i, depth + 1);
                    self.value(item, depth + 1)?;
                }
                self.close(']', items.is_empty(), depth);
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((self.key(&key)?, item));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    self.separator(i, depth + 1);
                    self.string(key);
                    self.out.push_str(&self.key_sep);
                    self.value(item, depth + 1)?;
                }
                self.close('}', entries.is_empty(), depth);
            }
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of type {kind} is not JSON serializable"),
                ))
            }
        }
        Ok(())
    }

    /// Python turns `None`, `True` and numbers used as keys into strings.
    fn key(&self, key: &Value) -> Result<String, Error> {
        Ok(match key.kind() {
            ValueKind::String => key.as_str().unwrap_or_default().to_string(),
            ValueKind::None => "null".to_string(),
            ValueKind::Bool => if key.is_true() { "true" } else { "false" }.to_string(),
            ValueKind::Number if key.is_integer() => key.to_string(),
            ValueKind::Number => py_float(f64::try_from(key.clone())?),
            kind => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: keys must be strings, not {kind}"),
                ))
            }
        })
    }

    fn separator(&mut self, index: usize, depth: usize) {
        if index > 0 {
            self.out.push_str(&self.item_sep);
        }
        self.newline(depth);
    }

    fn close(&mut self, bracket: char, empty: bool, depth: usize) {
        if !empty {
            self.newline(depth);
        }
        self.out.push(bracket);
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `repr(float)` as `json.dumps` writes it: shortest digits that round-trip, `1.0`
/// for integral values, exponent form (`1e-05`, `1.5e+16`) below 1e-4 and from 1e16 on.
pub(crate) fn py_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_string();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.to_string();
    }
    // `{:e}` gives the shortest round-trip digits: "-1.2345e-5", "1e16".
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let (int, frac) = if exp >= 0 {
            let point = exp as usize + 1;
            if digits.len() > point {
                (digits[..point].to_string(), digits[point..].to_string())
            } else {
                (format!("{digits}{}", "0".repeat(point - digits.len())), "0".to_string())
            }
        } else {
            ("0".to_string(), format!("{}{digits}", "0".repeat((-exp - 1) as usize)))
        };
        format!("{sign}{int}.{frac}")
    } else {
        let (first, rest) = digits.split_at(1);
        let rest = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let exp_sign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{rest}e{exp_sign}{:02}", exp.abs())
    }
}

/// `strftime_now(format)`: the current local time formatted like Python's `strftime` (as
/// transformers' template function does), through chrono's `strftime` specifiers. A
/// specifier chrono does not know is a template error.
pub(crate) fn strftime_now(format: String) -> Result<String, Error> {
    strftime(&format, &chrono::Local::now())
}

/// `time` formatted with `format`; see [`strftime_now`].
pub(crate) fn strftime<Tz: chrono::TimeZone>(format: &str, time: &chrono::DateTime<Tz>) -> Result<String, Error>
where
    Tz::Offset: std::fmt::Display,
{
    let mut out = String::new();
    write!(out, "{}", time.format(format))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: invalid format {format:?}")))?;
    Ok(out)
}

/// Rewrites transformers' `{% generation %}` / `{% endgeneration %}` tags (which mark the
/// assistant's text for training masks and render their body unchanged) as
/// `{% if true %}` / `{% endif %}`, keeping whitespace control (`{%-`, `-%}`).
pub(crate) fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // The closing `%}` is looked for after the opening `{%` (as Jinja's lexer does), so
        // `{%}` does not close itself; a tag that never closes is left as it is.
        let end = tag[2..].find("%}").map(|i| i + 2 + 2);
        match end.and_then(|len| generation_tag(&tag[..len]).map(|t| (len, t))) {
            Some((len, replacement)) => {
                out.push_str(&replacement);
                rest = &tag[len..];
            }
            None => {
                out.push_str("{%");
                rest = &tag[2..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// The replacement of one `{%...%}` tag if it is a generation tag; `None` for any other
/// tag, including malformed ones (`{%}`, `{%-}`, no closing `%}`).
fn generation_tag(tag: &str) -> Option<String> {
    if tag.len() < 4 {
        return None;
    }
    let inner = tag.strip_prefix("{%")?.strip_suffix("%}")?;
    let (open, inner) = match inner.strip_prefix(['-', '+']) {
        Some(rest) => (inner.get(..1)?, rest),
        None => ("", inner),
    };
    let (inner, close) = match inner.strip_suffix(['-', '+']) {
        Some(rest) => (rest, inner.get(rest.len()..)?),
        None => (inner, ""),
    };
    let body = match inner.trim() {
        "generation" => "if true",
        "endgeneration" => "endif",
        _ => return None,
    };
    Some(format!("{{%{open} {body} {close}%}}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        // 2024-02-29 13:05:09 UTC, a Thursday (Python: datetime(2024, 2, 29, 13, 5, 9).strftime(...)).
        let t = chrono::DateTime::from_timestamp(1_709_211_909, 0).unwrap();
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", &t).unwrap(), "2024-02-29 13:05:09");
        assert_eq!(
            strftime("%d %b %Y|%A %B %j|%I%p %y|%-d/%-m %e|%%", &t).unwrap(),
            "29 Feb 2024|Thursday February 060|01PM 24|29/2 29|%"
        );
        assert!(strftime("%Q", &t).is_err());
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            rewrite_generation_tags("a{% generation %}b{%- endgeneration -%}c"),
            "a{% if true %}b{%- endif -%}c"
        );
        assert_eq!(rewrite_generation_tags("{%+generation+%}"), "{%+ if true +%}");
        let other = "{% if x %}{{ '%}' }}{% endif %}{% generationx %}{%";
        assert_eq!(rewrite_generation_tags(other), other);
    }

    #[test]
    fn malformed_tags_are_left_alone() {
        for source in [
            "{%}",
            "{%-}",
            "{%+}",
            "{% %}",
            "{%%}",
            "{%-%}",
            "{%-+%}",
            "{%",
            "{%-",
            "a{% generation",
            "a{% generation %",
            "{%}{% generation",
            "x{%}y{%-}z{% %}w{%",
            "{%é%}{%-é-%}",
        ] {
            assert_eq!(rewrite_generation_tags(source), source, "{source:?}");
            assert!(crate::text::ChatTemplate::from_str(source).is_err(), "{source:?} parsed");
        }
        // A malformed tag before a real one does not hide it.
        assert_eq!(rewrite_generation_tags("{%}{% generation %}"), "{%}{% if true %}");
        assert_eq!(rewrite_generation_tags("{%-}x{%- endgeneration %}"), "{%-}x{%- endif %}");
        // `{%}` does not close itself: the tag runs to the next `%}`.
        assert_eq!(rewrite_generation_tags("{%} generation %}"), "{%} generation %}");
        let err = crate::text::ChatTemplate::from_str("hi {%} there").unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::LoadFailed, "{err}");
        assert!(err.message().starts_with("chat template <string>"), "{err}");
        assert!(err.message().contains("syntax error"), "{err}");
    }

    #[test]
    fn python_float_repr() {
        let cases = [
            (0.0, "0.0"),
            (-1.5, "-1.5"),
            (1e22, "1e+22"),
            (1.23e-10, "1.23e-10"),
            (9999999999999998.0, "9999999999999998.0"),
        ];
        for (x, repr) in cases {
            assert_eq!(py_float(x), repr);
        }
        assert_eq!(py_float(f64::NAN), "NaN");
        assert_eq!(py_float(f64::NEG_INFINITY), "-Infinity");
    }
}
