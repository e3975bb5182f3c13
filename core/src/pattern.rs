//! Event-name and source patterns.
//!
//! Event names are dotted (`host.cpu`): segments of `[A-Za-z0-9_-]`, the first starting with a
//! letter. A pattern may use `*` (any run of characters, dots included) and `?` (one character):
//! `host.*`, `*.avg1m`, `*`. Sources are free-form printable names (`hostA`, `hostA/eth0`) and
//! take the same wildcards. Patterns are parsed once; a malformed one is an error that names the
//! position, so an RPC can answer INVALID_ARGUMENT with something a person can act on.

use std::fmt;

/// Longest name, source or pattern accepted anywhere.
pub const MAX_NAME_LEN: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {text:?} at position {position}: {message}")]
pub struct PatternError {
    pub what: &'static str,
    pub text: String,
    /// Zero-based byte offset of the offending character.
    pub position: usize,
    pub message: String,
}

fn err(what: &'static str, text: &str, position: usize, message: impl Into<String>) -> PatternError {
    PatternError {
        what,
        text: text.chars().take(80).collect(),
        position,
        message: message.into(),
    }
}

/// A compiled pattern over names or sources.
#[derive(Clone, PartialEq, Eq)]
pub struct Pattern {
    text: String,
    kind: Kind,
}

#[derive(Clone, PartialEq, Eq)]
enum Kind {
    Any,
    Exact,
    Prefix(String),
    Glob,
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({:?})", self.text)
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Pattern {
    /// Parses an event-name pattern (`host.*`). The empty string is an error; use `*` for all.
    pub fn event(text: &str) -> Result<Pattern, PatternError> {
        check_dotted("event pattern", text, true)?;
        Ok(Self::compile(text))
    }

    /// Parses a source pattern (`hostA`, `sim-*`, `hostA/*`).
    pub fn source(text: &str) -> Result<Pattern, PatternError> {
        check_source("source pattern", text, true)?;
        Ok(Self::compile(text))
    }

    /// A pattern matching everything.
    pub fn any() -> Pattern {
        Self::compile("*")
    }

    fn compile(text: &str) -> Pattern {
        let kind = if text.chars().all(|c| c == '*') {
            Kind::Any
        } else if !text.contains(['*', '?']) {
            Kind::Exact
        } else if text.ends_with('*') && !text[..text.len() - 1].contains(['*', '?']) {
            Kind::Prefix(text[..text.len() - 1].to_string())
        } else {
            Kind::Glob
        };
        Pattern {
            text: text.to_string(),
            kind,
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// True when the pattern has no wildcard.
    pub fn is_exact(&self) -> bool {
        self.kind == Kind::Exact
    }

    pub fn matches(&self, s: &str) -> bool {
        match &self.kind {
            Kind::Any => true,
            Kind::Exact => self.text == s,
            Kind::Prefix(p) => s.starts_with(p.as_str()),
            Kind::Glob => glob_match(self.text.as_bytes(), s.as_bytes()),
        }
    }

    /// True when some name is matched by both patterns (e.g. a consumer accepting `host.*`
    /// and a search for `*.cpu`).
    pub fn overlaps(&self, other: &Pattern) -> bool {
        if self.is_exact() {
            return other.matches(&self.text);
        }
        if other.is_exact() {
            return self.matches(&other.text);
        }
        patterns_intersect(&self.text, &other.text)
    }
}

/// True when some string matches both glob patterns (`*` any run, `?` one character): a
/// search over pairs of positions, O(len(a) * len(b)).
pub fn patterns_intersect(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let width = b.len() + 1;
    let mut seen = vec![false; (a.len() + 1) * width];
    let mut stack = vec![(0usize, 0usize)];
    while let Some((i, j)) = stack.pop() {
        if std::mem::replace(&mut seen[i * width + j], true) {
            continue;
        }
        if i == a.len() && j == b.len() {
            return true;
        }
        let (ca, cb) = (a.get(i).copied(), b.get(j).copied());
        // A star may match nothing.
        if ca == Some(b'*') {
            stack.push((i + 1, j));
        }
        if cb == Some(b'*') {
            stack.push((i, j + 1));
        }
        // Both consume one common character; a star stays put after consuming.
        if let (Some(x), Some(y)) = (ca, cb) {
            let compatible = x == y || matches!(x, b'*' | b'?') || matches!(y, b'*' | b'?');
            if compatible {
                let ni = if x == b'*' { i } else { i + 1 };
                let nj = if y == b'*' { j } else { j + 1 };
                if (ni, nj) != (i, j) {
                    stack.push((ni, nj));
                }
            }
        }
    }
    false
}

/// Iterative glob matcher over bytes (`*` any run, `?` one byte). A `*` of the pattern is
/// always a wildcard, even facing a literal `*` in the subject.
fn glob_match(p: &[u8], s: &[u8]) -> bool {
    glob_with(p, s, b'*', |p, s| p == b'?' || p == s)
}

/// Star-backtracking glob over any symbols: `star` matches any run, `one(p, s)` decides a
/// single pattern symbol against a single subject symbol. O(len(p) * len(s)) worst case.
pub(crate) fn glob_with<T: Copy + PartialEq>(p: &[T], s: &[T], star: T, one: impl Fn(T, T) -> bool) -> bool {
    let (mut pi, mut si) = (0usize, 0usize);
    let mut back: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == star {
            back = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && one(p[pi], s[si]) {
            pi += 1;
            si += 1;
        } else if let Some((bp, bs)) = back {
            pi = bp + 1;
            si = bs + 1;
            back = Some((bp, bs + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == star {
        pi += 1;
    }
    pi == p.len()
}

fn check_len(what: &'static str, text: &str) -> Result<(), PatternError> {
    if text.is_empty() {
        return Err(err(what, text, 0, "must not be empty"));
    }
    if text.len() > MAX_NAME_LEN {
        return Err(err(
            what,
            text,
            MAX_NAME_LEN,
            format!("longer than {MAX_NAME_LEN} bytes"),
        ));
    }
    Ok(())
}

fn check_dotted(what: &'static str, text: &str, wildcards: bool) -> Result<(), PatternError> {
    check_len(what, text)?;
    let mut seg_start = true;
    for (i, c) in text.char_indices() {
        match c {
            '.' => {
                if seg_start {
                    return Err(err(what, text, i, "empty name segment"));
                }
                seg_start = true;
                continue;
            }
            '*' | '?' if wildcards => {}
            '*' | '?' => {
                return Err(err(
                    what,
                    text,
                    i,
                    format!("wildcard {c:?} not allowed in a name"),
                ))
            }
            c if c.is_ascii_alphanumeric() || c == '_' || c == '-' => {
                if i == 0 && !wildcards && !c.is_ascii_alphabetic() {
                    return Err(err(what, text, i, "must start with a letter"));
                }
            }
            c => {
                return Err(err(
                    what,
                    text,
                    i,
                    format!("character {c:?} not allowed (use letters, digits, '_', '-', '.', '*', '?')"),
                ))
            }
        }
        seg_start = false;
    }
    if seg_start {
        return Err(err(what, text, text.len(), "ends with '.'"));
    }
    Ok(())
}

fn check_source(what: &'static str, text: &str, wildcards: bool) -> Result<(), PatternError> {
    check_len(what, text)?;
    for (i, c) in text.char_indices() {
        if !wildcards && (c == '*' || c == '?') {
            return Err(err(
                what,
                text,
                i,
                format!("wildcard {c:?} not allowed in a source"),
            ));
        }
        if !c.is_ascii_graphic() {
            return Err(err(
                what,
                text,
                i,
                format!("character {c:?} not allowed (printable ASCII, no spaces)"),
            ));
        }
    }
    Ok(())
}

/// Validates a concrete event name (no wildcards).
pub fn validate_event_name(name: &str) -> Result<(), PatternError> {
    check_dotted("event name", name, false)
}

/// Validates a concrete source name (no wildcards).
pub fn validate_source(source: &str) -> Result<(), PatternError> {
    check_source("source", source, false)
}

/// Most patterns one request may list (event or source patterns).
pub const MAX_PATTERNS: usize = 1024;

fn check_count(what: &'static str, list: &[String]) -> Result<(), PatternError> {
    if list.len() > MAX_PATTERNS {
        return Err(err(
            what,
            "",
            0,
            format!(
                "{} patterns given, at most {MAX_PATTERNS} are accepted",
                list.len()
            ),
        ));
    }
    Ok(())
}

/// Compiles a list of event patterns (at most [`MAX_PATTERNS`]); an empty list is an error.
pub fn event_patterns(list: &[String]) -> Result<Vec<Pattern>, PatternError> {
    check_count("event pattern list", list)?;
    if list.is_empty() {
        return Err(err(
            "event pattern list",
            "",
            0,
            "give at least one pattern (\"*\" for all)",
        ));
    }
    list.iter().map(|p| Pattern::event(p)).collect()
}

/// Compiles a list of source patterns; an empty list means "any source" (returns empty).
pub fn source_patterns(list: &[String]) -> Result<Vec<Pattern>, PatternError> {
    check_count("source pattern list", list)?;
    list.iter().map(|p| Pattern::source(p)).collect()
}

/// True when `s` matches any pattern of `list`, or `list` is empty.
pub fn any_match(list: &[Pattern], s: &str) -> bool {
    list.is_empty() || list.iter().any(|p| p.matches(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching() {
        let p = Pattern::event("host.*").unwrap();
        assert!(p.matches("host.cpu"));
        assert!(p.matches("host.cpu.avg1m"));
        assert!(!p.matches("hostx.cpu"));
        assert!(Pattern::event("*").unwrap().matches("anything.at.all"));
        let g = Pattern::event("*.avg?m").unwrap();
        assert!(g.matches("host.cpu.avg1m"));
        assert!(!g.matches("host.cpu.avg10m"));
        assert!(Pattern::event("h*t.c*u").unwrap().matches("host.cpu"));
        assert!(Pattern::event("host.cpu").unwrap().matches("host.cpu"));
        assert!(!Pattern::event("host.cpu").unwrap().matches("host.cpux"));
        assert!(Pattern::source("sim-*").unwrap().matches("sim-0001"));
        assert!(Pattern::source("hostA/*").unwrap().matches("hostA/eth0"));
    }

    #[test]
    fn malformed_patterns_name_the_position() {
        let e = Pattern::event("host..cpu").unwrap_err();
        assert_eq!(e.position, 5);
        assert!(e.to_string().contains("empty name segment"), "{e}");
        let e = Pattern::event("host cpu").unwrap_err();
        assert_eq!(e.position, 4);
        assert!(Pattern::event("").is_err());
        assert!(Pattern::event("host.").is_err());
        assert!(Pattern::event(".host").is_err());
        assert!(Pattern::event(&"a".repeat(300)).is_err());
        assert!(Pattern::source("a b").is_err());
        assert!(validate_event_name("host.*").is_err());
        assert!(validate_event_name("1host").is_err());
        assert!(validate_event_name("host.cpu").is_ok());
        assert!(validate_source("hostA/eth0").is_ok());
    }

    #[test]
    fn overlap() {
        let exact = Pattern::event("host.cpu").unwrap();
        assert!(exact.overlaps(&Pattern::event("host.*").unwrap()));
        assert!(!exact.overlaps(&Pattern::event("net.*").unwrap()));
        let host = Pattern::event("host.*").unwrap();
        assert!(host.overlaps(&Pattern::event("*.cpu").unwrap()));
        assert!(!host.overlaps(&Pattern::event("net.*").unwrap()));
    }

    #[test]
    fn a_star_in_the_pattern_is_a_wildcard_even_against_a_literal_star() {
        // Found by the `pattern` fuzz target.
        assert!(Pattern::source("*a").unwrap().matches("*ba"));
        assert!(Pattern::source("*b*c").unwrap().matches("*aXbYc"));
    }

    #[test]
    fn glob_backtracking_is_bounded() {
        let p = Pattern::event("*a*a*a*a*a*b").unwrap();
        assert!(!p.matches(&"a".repeat(200)));
    }
}
