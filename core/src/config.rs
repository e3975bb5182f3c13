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
        let at = e
            .span()
            .map(|span| {
                let before = &text[..span.start.min(text.len())];
                let line = before.matches('\n').count() + 1;
                let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                format!("line {line}, column {col}: ")
            })
            .unwrap_or_default();
        ConfigError::Parse {
            path: origin.to_string(),
            message: format!("{at}{}", e.message()),
        }
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
