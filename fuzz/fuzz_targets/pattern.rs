//! Event-name and source patterns: `Pattern::event`, `Pattern::source`, `matches`, `overlaps`,
//! `patterns_intersect`, and the name validators.
//!
//! Input: lossy UTF-8, split at the first two '\n' into `a`, `b` and a subject `s`.
//! Oracles besides "never panics": `matches` agrees with a reference glob matcher; every
//! pattern matches its own instantiation; `patterns_intersect` is symmetric, true for a pattern
//! with itself, and equals `matches` when one side has no wildcard; `overlaps` is symmetric.
#![no_main]

use gma_core::pattern::{
    any_match, event_patterns, patterns_intersect, source_patterns, validate_event_name, validate_source,
    Pattern, MAX_NAME_LEN,
};
use gma_fuzz::MAX_INPUT;
use libfuzzer_sys::fuzz_target;

/// `patterns_intersect` takes O(len(a) * len(b)) memory; the RPCs only pass validated
/// patterns (at most MAX_NAME_LEN bytes), so raw strings are capped to keep runs bounded.
const RAW_CAP: usize = 4 * MAX_NAME_LEN;

/// Compare `matches` with the reference also for subjects holding a literal `*`. Off: the
/// first run found that `glob_match` (core/src/pattern.rs) then takes a pattern `*` for a
/// literal (`Pattern::source("*a").matches("*ba")` is false). Valid names and sources never
/// hold `*`, so only unvalidated subjects are affected. Turn on once that is fixed.
const STAR_IN_SUBJECT: bool = true;

/// Reference glob matcher (`*` any run of bytes, `?` one byte): a plain DP table.
fn reference_match(p: &[u8], s: &[u8]) -> bool {
    // row[j]: p[..i] matches s[..j]
    let mut row = vec![false; s.len() + 1];
    row[0] = true;
    for &c in p {
        let mut next = vec![false; s.len() + 1];
        if c == b'*' {
            next[0] = row[0];
            for j in 1..=s.len() {
                next[j] = row[j] || next[j - 1];
            }
        } else {
            for j in 1..=s.len() {
                next[j] = row[j - 1] && (c == b'?' || c == s[j - 1]);
            }
        }
        row = next;
    }
    row[s.len()]
}

/// A string the pattern must match: `*` matches nothing, `?` the byte `x`.
fn instantiate(p: &str) -> String {
    p.chars()
        .filter(|&c| c != '*')
        .map(|c| if c == '?' { 'x' } else { c })
        .collect()
}

fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?'])
}

fn check(p: &Pattern, other: Option<&Pattern>, s: &str) {
    let text = p.as_str();
    assert!(text.len() <= MAX_NAME_LEN);
    assert!(
        p.matches(&instantiate(text)),
        "{p:?} does not match its instantiation"
    );
    assert!(patterns_intersect(text, text), "{p:?} does not intersect itself");
    assert!(p.overlaps(p));
    for subject in [s, text] {
        if subject.len() <= RAW_CAP && (STAR_IN_SUBJECT || !subject.contains('*')) {
            assert_eq!(
                p.matches(subject),
                reference_match(text.as_bytes(), subject.as_bytes()),
                "{p:?} vs {subject:?}"
            );
        }
    }
    if p.is_exact() {
        assert_eq!(p.matches(s), text == s);
    }
    if let Some(q) = other {
        let (a, b) = (p.as_str(), q.as_str());
        let o = p.overlaps(q);
        assert_eq!(o, q.overlaps(p), "overlaps not symmetric: {p:?} {q:?}");
        assert_eq!(
            o,
            patterns_intersect(a, b),
            "overlaps != patterns_intersect: {p:?} {q:?}"
        );
        if !has_wildcard(b) {
            // `overlaps` with an exact pattern is `matches`, so check that without the
            // reference (b has no '*').
            assert_eq!(o, p.matches(b), "{p:?} overlaps exact {q:?} != matches");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    let text = String::from_utf8_lossy(data);
    let mut parts = text.splitn(3, '\n');
    let a = parts.next().unwrap_or("");
    let b = parts.next().unwrap_or("");
    let s = parts.next().unwrap_or("");

    if a.len() <= RAW_CAP && b.len() <= RAW_CAP {
        let ab = patterns_intersect(a, b);
        assert_eq!(
            ab,
            patterns_intersect(b, a),
            "patterns_intersect not symmetric: {a:?} {b:?}"
        );
        assert!(patterns_intersect(a, a), "{a:?} does not intersect itself");
        if !has_wildcard(b) {
            assert_eq!(
                ab,
                reference_match(a.as_bytes(), b.as_bytes()),
                "{a:?} vs exact {b:?}"
            );
        }
    }

    let (ea, eb) = (Pattern::event(a), Pattern::event(b));
    let (sa, sb) = (Pattern::source(a), Pattern::source(b));
    if let Ok(p) = &ea {
        check(p, eb.as_ref().ok(), s);
        check(p, sb.as_ref().ok(), s);
    }
    if let Ok(p) = &sa {
        check(p, sb.as_ref().ok(), s);
        check(p, eb.as_ref().ok(), s);
    }
    if validate_event_name(a).is_ok() {
        let p = ea.as_ref().expect("a valid event name is a valid event pattern");
        assert!(p.is_exact() && p.matches(a));
    }
    if validate_source(a).is_ok() {
        let p = sa.as_ref().expect("a valid source is a valid source pattern");
        assert!(p.is_exact() && p.matches(a));
    }
    let _ = validate_event_name(s);
    let _ = validate_source(s);

    // Lists: one pattern per line.
    let list: Vec<String> = text.lines().take(64).map(str::to_string).collect();
    if let Ok(ps) = event_patterns(&list) {
        let _ = any_match(&ps, s);
    }
    if let Ok(ps) = source_patterns(&list) {
        let _ = any_match(&ps, s);
    }
});
