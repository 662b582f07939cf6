//! The expectations file: a backend's known gaps, one per line:
//!
//! ```text
//! # comment
//! <case-id glob>  <skip|xfail>  <reason (mandatory)>
//! ```
//!
//! `skip` does not run matching cases (for crashers); `xfail` runs them and reports a failure
//! as `xfail` and a pass as `xpass`. Entries that match no case, and `xfail` entries whose
//! cases all passed, are reported as stale.

/// What an entry does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Do not run.
    Skip,
    /// Run; failure expected.
    XFail,
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Case-id glob (`*` any run of characters, `?` one character).
    pub glob: String,
    /// What to do with matching cases.
    pub action: Action,
    /// Why (printed in the report).
    pub reason: String,
    /// Line number, for messages.
    pub line: usize,
}

/// A parsed expectations file.
#[derive(Debug, Clone, Default)]
pub struct Expectations {
    /// Where it was read from.
    pub path: String,
    /// Its entries in file order (the first match wins).
    pub entries: Vec<Entry>,
}

impl Expectations {
    /// Parse `text`; errors name the line.
    pub fn parse(path: &str, text: &str) -> Result<Expectations, String> {
        let mut entries = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let glob = parts.next().unwrap_or_default().to_string();
            let action = match parts.next() {
                Some("skip") => Action::Skip,
                Some("xfail") => Action::XFail,
                other => {
                    return Err(format!("{path}:{}: expected `skip` or `xfail` after the glob, found {other:?}", i + 1))
                }
            };
            let reason = parts.collect::<Vec<_>>().join(" ");
            if reason.is_empty() {
                return Err(format!("{path}:{}: every entry needs a reason", i + 1));
            }
            entries.push(Entry { glob, action, reason, line: i + 1 });
        }
        Ok(Expectations { path: path.to_string(), entries })
    }

    /// Read and parse a file.
    pub fn load(path: &str) -> Result<Expectations, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        Expectations::parse(path, &text)
    }

    /// The first entry matching `id`.
    pub fn lookup(&self, id: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| glob_match(&e.glob, id))
    }
}

/// `*` matches any run of characters (including `/`), `?` exactly one.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti, mut star, mut mark) = (0, 0, None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("op/*", "op/add/f32/x", true)]
    #[case("*/f16/*", "elementwise/add/f16/odd37", true)]
    #[case("*/f16/*", "elementwise/add/f32/odd37", false)]
    #[case("memory/roundtrip/f??", "memory/roundtrip/f32", true)]
    #[case("memory/roundtrip/f??", "memory/roundtrip/bf16", false)]
    #[case("exact", "exact", true)]
    fn globs(#[case] pattern: &str, #[case] text: &str, #[case] expected: bool) {
        assert_eq!(glob_match(pattern, text), expected);
    }

    #[rstest]
    fn parse_requires_reasons() {
        let e = Expectations::parse("x", "# c\nnn/*/f16/*   xfail  f16 softmax is approximate\n").unwrap();
        assert_eq!(e.entries[0].action, Action::XFail);
        assert!(e.lookup("nn/softmax/f16/rows").is_some());
        assert!(Expectations::parse("x", "a skip\n").is_err());
        assert!(Expectations::parse("x", "a maybe why\n").is_err());
    }
}
