//! Provenance: with `provenance = true` the archiver stores, with every event it keeps, the
//! producer run the event came from and its seq, as two extra fields of the event's stream:
//!
//! - [`RUN_FIELD`] `_gma_run`, a string `<producer id>/<epoch>` (run-coded in the chunks: a
//!   run's rows share one value);
//! - [`SEQ_FIELD`] `_gma_seq`, a double holding the seq (exact below 2^53).
//!
//! Both are columns of the same stored row as the event's own fields, so reading them back
//! through `Archive.Query` tells, per producer run, exactly which seqs the archive holds — what
//! `gma bench scale` checks (every seq 1..=N of every run, exactly once). A seq is per producer
//! run across all its series; the archive stores per series, so a run's seqs are the union over
//! every series of its rows.
//!
//! The extra fields change a stream's schema, so a data directory is written either always with
//! provenance or always without: [`check_marker`] enforces it (a stream whose stored fields
//! differ from the delivered ones would otherwise have its events refused).

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use gma_core::codec::{OwnedEvent, SeriesInfo};
use gma_core::event::{dbl, text, Layout};
use gma_proto::v1 as pb;

use crate::error::Error;

/// The string field naming the producer run: `<producer id>/<epoch>`.
pub const RUN_FIELD: &str = "_gma_run";
/// The double field holding the event's seq within its producer run.
pub const SEQ_FIELD: &str = "_gma_seq";
/// The marker file in the data directory of an archive written with provenance.
pub const MARKER: &str = "provenance";

/// The [`RUN_FIELD`] value of a producer run.
pub fn run_label(producer: &str, epoch: u64) -> String {
    format!("{producer}/{epoch}")
}

/// (producer id, epoch) of a [`RUN_FIELD`] value.
pub fn parse_run(label: &str) -> Option<(&str, u64)> {
    let (p, e) = label.rsplit_once('/')?;
    Some((p, e.parse().ok()?))
}

/// Checks that the data directory `dir` was written with the same provenance setting as `on`
/// (writing the marker when a new archive starts with provenance). An error says what to do.
pub fn check_marker(dir: &Path, on: bool) -> Result<(), Error> {
    let marker = dir.join(MARKER);
    let has_marker = marker.exists();
    // A store exists once its sled folder does (Store::open creates it).
    let has_store = dir.join("sled").exists();
    match (on, has_marker) {
        (true, true) | (false, false) => Ok(()),
        (true, false) if !has_store => std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(&marker, b"_gma_run _gma_seq\n"))
            .map_err(|e| Error::Config(format!("cannot write {}: {e}", marker.display()))),
        (true, false) => Err(Error::Config(format!(
            "{} holds an archive written without provenance: set provenance = false or use a new data_dir",
            dir.display()
        ))),
        (false, true) => Err(Error::Config(format!(
            "{} holds an archive written with provenance: set provenance = true or use a new data_dir",
            dir.display()
        ))),
    }
}

/// A stream's delivered fields and its extended series (`None` when the delivered schema
/// already has a field of a provenance name).
type Extended = (Arc<[pb::FieldSpec]>, Option<Arc<SeriesInfo>>);

/// Adds the provenance fields to events. Remembers the extended schema of every stream.
#[derive(Default)]
pub struct Stamper {
    /// (name, source, schema version) → its [`Extended`].
    streams: HashMap<(String, String, u32), Extended>,
}

impl Stamper {
    /// Adds [`RUN_FIELD`] and [`SEQ_FIELD`] to every event of `events` (of one delivery of
    /// `producer`'s run `epoch`). Returns how many events could not be stamped (their schema
    /// already declares a field of that name); those are stored as delivered.
    pub fn stamp(&mut self, producer: &str, epoch: u64, events: &mut [OwnedEvent]) -> u64 {
        let label = run_label(producer, epoch);
        let mut skipped = 0;
        // The events of one series share its Arc (the decoder's): look each series up once.
        // The map holds the Arc it is keyed on, so no address is reused during the call.
        type Seen = (Arc<SeriesInfo>, Option<Arc<SeriesInfo>>);
        let mut seen: HashMap<*const SeriesInfo, Seen> = HashMap::new();
        for e in events.iter_mut() {
            let ext = match seen.get(&Arc::as_ptr(&e.series)) {
                Some((_, x)) => x.clone(),
                None => {
                    let x = self.extended(&e.series);
                    seen.insert(Arc::as_ptr(&e.series), (e.series.clone(), x.clone()));
                    x
                }
            };
            let Some(series) = ext else {
                skipped += 1;
                continue;
            };
            e.series = series;
            e.numbers.push(e.seq as f64);
            e.strings.push(label.clone());
        }
        skipped
    }

    fn extended(&mut self, s: &Arc<SeriesInfo>) -> Option<Arc<SeriesInfo>> {
        let key = (s.name.clone(), s.source.clone(), s.schema_version);
        if let Some((fields, ext)) = self.streams.get(&key) {
            if Arc::ptr_eq(fields, &s.fields) || fields[..] == s.fields[..] {
                return ext.clone();
            }
        }
        let clash = s
            .fields
            .iter()
            .any(|f| f.name == RUN_FIELD || f.name == SEQ_FIELD);
        let ext = if clash {
            tracing::warn!(
                name = %s.name, source = %s.source,
                "the schema already has a field named {RUN_FIELD} or {SEQ_FIELD}: its events are stored without provenance"
            );
            None
        } else {
            let mut fields = s.fields.to_vec();
            fields.push(text(
                RUN_FIELD,
                "producer run (<producer id>/<epoch>) of the event",
            ));
            fields.push(dbl(SEQ_FIELD, "", "seq of the event within its producer run"));
            Some(Arc::new(SeriesInfo {
                id: s.id,
                name: s.name.clone(),
                source: s.source.clone(),
                schema_version: s.schema_version,
                layout: Layout::of(&fields),
                fields: fields.into(),
            }))
        };
        self.streams.insert(key, (s.fields.clone(), ext.clone()));
        ext
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use gma_core::codec::Mark;

    fn series(fields: Vec<pb::FieldSpec>) -> Arc<SeriesInfo> {
        Arc::new(SeriesInfo::new(
            0,
            "host.load",
            "h1",
            &pb::EventSchema {
                name: "host.load".into(),
                version: 1,
                fields,
                description: String::new(),
            },
        ))
    }

    fn ev(s: &Arc<SeriesInfo>, seq: u64) -> OwnedEvent {
        OwnedEvent {
            series: s.clone(),
            seq,
            timestamp_ns: seq as i64,
            numbers: vec![1.5],
            strings: vec!["x".into()],
            mark: Mark::None,
        }
    }

    #[test]
    fn stamps_run_and_seq_as_last_fields() {
        let s = series(vec![dbl("load1", "", ""), text("state", "")]);
        let mut st = Stamper::default();
        let mut evs = vec![ev(&s, 7), ev(&s, 9)];
        assert_eq!(st.stamp("p0", 42, &mut evs), 0);
        for (e, seq) in evs.iter().zip([7.0, 9.0]) {
            assert_eq!(e.numbers, vec![1.5, seq]);
            assert_eq!(e.strings, vec!["x".to_string(), "p0/42".to_string()]);
            let names: Vec<&str> = e.series.fields.iter().map(|f| f.name.as_str()).collect();
            assert_eq!(names, ["load1", "state", RUN_FIELD, SEQ_FIELD]);
            assert_eq!(
                e.series.layout,
                Layout {
                    doubles: 2,
                    strings: 2
                }
            );
        }
        // One extended series per stream, shared.
        assert!(Arc::ptr_eq(&evs[0].series, &evs[1].series));
        assert_eq!(parse_run("p0/42"), Some(("p0", 42)));
        assert_eq!(parse_run("a/b/7"), Some(("a/b", 7)));
        assert_eq!(parse_run("p0"), None);
    }

    #[test]
    fn a_clashing_schema_is_left_alone() {
        let s = series(vec![dbl(SEQ_FIELD, "", "")]);
        let mut st = Stamper::default();
        let mut evs = vec![ev(&s, 1)];
        evs[0].strings.clear();
        assert_eq!(st.stamp("p0", 1, &mut evs), 1);
        assert_eq!(evs[0].numbers, vec![1.5]);
        assert!(Arc::ptr_eq(&evs[0].series, &s));
    }

    #[test]
    fn the_marker_keeps_a_data_dir_on_one_setting() {
        let d = tempfile::tempdir().unwrap();
        let fresh = d.path().join("a");
        check_marker(&fresh, true).unwrap();
        assert!(fresh.join(MARKER).exists());
        check_marker(&fresh, true).unwrap();
        assert!(check_marker(&fresh, false)
            .unwrap_err()
            .to_string()
            .contains("provenance = true"));
        let old = d.path().join("b");
        std::fs::create_dir_all(old.join("sled")).unwrap();
        check_marker(&old, false).unwrap();
        assert!(check_marker(&old, true)
            .unwrap_err()
            .to_string()
            .contains("without provenance"));
    }
}
