//! The forwarder's resume state, `DATA/remote_write.json`: for the remote it was written for
//! (its URL), per archived series the last millisecond the remote acknowledged, and the request
//! in flight (per series its first and last millisecond) if one was sent and not yet answered.
//! Replaced atomically: written to a temporary file, fsynced, renamed over, folder fsynced.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::batch::SeriesKey;
use super::RemoteWriteError as E;

/// The file name under the data directory.
pub const FILE: &str = "remote_write.json";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Acked {
    #[serde(flatten)]
    key: SeriesKey,
    ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct InFlight {
    #[serde(flatten)]
    key: SeriesKey,
    first_ms: i64,
    last_ms: i64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct OnDisk {
    url: String,
    acked: Vec<Acked>,
    in_flight: Option<Vec<InFlight>>,
}

/// The resume state in memory.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct State {
    pub url: String,
    /// Last millisecond acknowledged per series.
    pub acked: BTreeMap<SeriesKey, i64>,
    /// The request sent and not yet answered: (series, first ms, last ms).
    pub in_flight: Option<Vec<(SeriesKey, i64, i64)>>,
}

impl State {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(FILE)
    }

    /// The state stored for `url`; a fresh one when there is none, or when it was written for
    /// another remote (which holds none of our samples).
    pub fn load(data_dir: &Path, url: &str) -> Result<State, E> {
        let path = State::path(data_dir);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(State {
                    url: url.to_string(),
                    ..State::default()
                })
            }
            Err(source) => {
                return Err(E::StateIo {
                    what: "cannot read",
                    path,
                    source,
                })
            }
        };
        let d: OnDisk = serde_json::from_slice(&text).map_err(|source| E::StateCorrupt { path, source })?;
        if d.url != url {
            tracing::warn!(old = %d.url, new = %url, "remote write: new remote URL; sending everything archived to it");
            return Ok(State {
                url: url.to_string(),
                ..State::default()
            });
        }
        Ok(State {
            url: d.url,
            acked: d.acked.into_iter().map(|a| (a.key, a.ms)).collect(),
            in_flight: d
                .in_flight
                .map(|v| v.into_iter().map(|f| (f.key, f.first_ms, f.last_ms)).collect()),
        })
    }

    /// Writes the state durably (see the module documentation).
    pub fn save(&self, data_dir: &Path) -> Result<(), E> {
        let d = OnDisk {
            url: self.url.clone(),
            acked: self
                .acked
                .iter()
                .map(|(k, ms)| Acked {
                    key: k.clone(),
                    ms: *ms,
                })
                .collect(),
            in_flight: self.in_flight.as_ref().map(|v| {
                v.iter()
                    .map(|(k, a, b)| InFlight {
                        key: k.clone(),
                        first_ms: *a,
                        last_ms: *b,
                    })
                    .collect()
            }),
        };
        let text = serde_json::to_vec(&d).map_err(E::StateEncode)?;
        let path = State::path(data_dir);
        let tmp = data_dir.join(format!("{FILE}.tmp"));
        let io = |what: &'static str, source: std::io::Error| E::StateIo {
            what,
            path: path.clone(),
            source,
        };
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", e))?;
        f.write_all(&text).map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("fsync", e))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(|e| io("rename onto", e))?;
        std::fs::File::open(data_dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("fsync the folder of", e))
    }

    /// The request in flight was answered (acknowledged or dropped): its series move on.
    pub fn settle(&mut self) {
        for (k, _, last) in self.in_flight.take().unwrap_or_default() {
            let e = self.acked.entry(k).or_insert(last);
            *e = (*e).max(last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> SeriesKey {
        SeriesKey {
            event: "e".into(),
            source: s.into(),
            field: "f".into(),
        }
    }

    #[test]
    fn saved_state_loads_back_and_another_url_starts_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = State::load(dir.path(), "http://a/w").unwrap();
        assert_eq!(
            s,
            State {
                url: "http://a/w".into(),
                ..State::default()
            }
        );
        s.acked.insert(key("h1"), 10);
        s.in_flight = Some(vec![(key("h1"), 11, 20), (key("h2"), 5, 6)]);
        s.save(dir.path()).unwrap();
        let back = State::load(dir.path(), "http://a/w").unwrap();
        assert_eq!(back, s);
        let mut settled = back.clone();
        settled.settle();
        assert_eq!(settled.in_flight, None);
        assert_eq!(settled.acked.get(&key("h1")), Some(&20));
        assert_eq!(settled.acked.get(&key("h2")), Some(&6));
        assert!(State::load(dir.path(), "http://b/w").unwrap().acked.is_empty());
        std::fs::write(State::path(dir.path()), "nope").unwrap();
        let e = State::load(dir.path(), "http://a/w").unwrap_err().to_string();
        assert!(e.contains("move it away"), "{e}");
    }
}
