//! Configuration files: one `serde(deny_unknown_fields)` struct per role, read from TOML.

use std::path::Path;

use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: String, message: String },
}

/// Reads and parses a TOML file into `T`; unknown keys are errors when `T` denies them.
pub fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })?;
    parse_toml(&text, &path.display().to_string())
}

/// Parses TOML text; `origin` names it in errors.
pub fn parse_toml<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let at_span = |span: std::ops::Range<usize>| {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
            (line, col)
        };
        // A key left over for a flattened section is reported on the whole table: name its line.
        let whole = |span: &std::ops::Range<usize>| span.start == 0 && span.end >= text.trim_end().len();
        let at = e
            .span()
            .filter(|s| !whole(s))
            .map(at_span)
            .or_else(|| unknown_key_at(text, e.message()))
            .or_else(|| e.span().map(at_span))
            .map(|(line, col)| format!("line {line}, column {col}: "))
            .unwrap_or_default();
        ConfigError::Parse {
            path: origin.to_string(),
            message: format!("{at}{}", e.message()),
        }
    })
}

/// The line of the key an `unknown field` error names, when the parser gave no position: keys
/// left over for a flattened section (`gma_core::endpoint::Endpoint`) are rejected after the
/// whole table was read. The first line that assigns the key is the one meant.
fn unknown_key_at(text: &str, message: &str) -> Option<(usize, usize)> {
    let key = message.strip_prefix("unknown field `")?.split('`').next()?;
    text.lines().enumerate().find_map(|(i, line)| {
        let l = line.trim_start();
        let rest = l
            .strip_prefix(key)
            .or_else(|| l.strip_prefix(&format!("\"{key}\"")))
            .or_else(|| l.strip_prefix(&format!("'{key}'")));
        rest.is_some_and(|r| r.trim_start().starts_with('='))
            .then(|| (i + 1, line.len() - l.len() + 1))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Demo {
        listen: String,
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = parse_toml::<Demo>("listen = \"a\"\nlsten = 1\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("unknown field `lsten`"), "{err}");
        assert!(err.to_string().contains("line 2, column 1"), "{err}");
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let err = load_toml::<Demo>(Path::new("/nonexistent/gma.toml")).unwrap_err();
        assert!(err
            .to_string()
            .starts_with("cannot read config file /nonexistent/gma.toml"));
    }
}
