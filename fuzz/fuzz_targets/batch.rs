//! The stream decoder: `prost::Message::decode` of `EventBatch` from arbitrary bytes, then
//! `BatchDecoder::decode`.
//!
//! Input: (1) the whole input as one batch on a fresh decoder; (2) the input as a stream of
//! varint-length-delimited batches fed in order to one decoder (stops at the first frame that
//! does not decode). Oracles besides "never panics": a decoded batch yields one event per
//! series id, each with exactly its schema's doubles and strings, seqs strictly increasing
//! within and across batches, JSON lines that parse, field accessors that agree with the
//! layout; re-decoding a non-empty batch is refused (seq does not follow) until `reset_seq`,
//! after which it decodes to the same events.
#![no_main]

use gma_core::codec::{BatchDecoder, EventRef, OwnedEvent};
use gma_fuzz::{assert_json, same_f64, MAX_INPUT};
use gma_proto::v1::{self as pb, FieldType};
use libfuzzer_sys::fuzz_target;
use prost::Message;

/// At most this many batches per input in the stream mode.
const MAX_BATCHES: usize = 64;

fn check_event(e: EventRef<'_>) {
    let l = e.series.layout;
    assert_eq!(e.numbers.len(), l.doubles);
    assert_eq!(e.strings.len(), l.strings);
    assert_json(&e.to_json());
    let fields = &e.series.fields;
    let (mut ni, mut si) = (0usize, 0usize);
    for f in fields.iter() {
        // The accessors answer for the first field of a name; only check unique names.
        let unique = fields.iter().filter(|g| g.name == f.name).count() == 1;
        if f.r#type() == FieldType::String {
            if unique {
                assert_eq!(e.text(&f.name), Some(e.strings[si].as_str()));
                assert_eq!(e.number(&f.name), None);
            }
            si += 1;
        } else {
            if unique {
                let got = e.number(&f.name).map(f64::to_bits);
                assert_eq!(got, Some(e.numbers[ni].to_bits()));
                assert_eq!(e.text(&f.name), None);
            }
            ni += 1;
        }
    }
    assert_eq!((ni, si), (l.doubles, l.strings));
    let owned = e.to_owned_event();
    assert!(same_events(
        std::slice::from_ref(&owned),
        std::slice::from_ref(&owned.as_ref().to_owned_event())
    ));
}

fn same_events(a: &[OwnedEvent], b: &[OwnedEvent]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.series == y.series
                && x.seq == y.seq
                && x.timestamp_ns == y.timestamp_ns
                && same_f64(&x.numbers, &y.numbers)
                && x.strings == y.strings
                && x.mark == y.mark
        })
}

/// Decodes `b` on `d`; `last` is the last seq this decoder delivered (None after a reset).
fn decode(d: &mut BatchDecoder, b: &pb::EventBatch, last: &mut Option<u64>) {
    let Ok(events) = d.decode(b) else {
        return;
    };
    assert_eq!(events.len(), b.series_ids.len());
    for e in &events {
        if let Some(prev) = *last {
            assert!(e.seq > prev, "seq {} delivered after {prev}", e.seq);
        }
        *last = Some(e.seq);
        check_event(e.as_ref());
    }
    if events.is_empty() {
        return;
    }
    assert!(
        d.decode(b).is_err(),
        "a batch was accepted twice without reset_seq"
    );
    d.reset_seq();
    let again = d
        .decode(b)
        .expect("a batch that decoded decodes again after reset_seq");
    assert!(
        same_events(&events, &again),
        "re-decoding after reset_seq gave other events"
    );
    // The decoder's last seq is that of this batch again.
    *last = events.last().map(|e| e.seq);
}

fuzz_target!(|data: &[u8]| {
    if data.len() > MAX_INPUT {
        return;
    }
    if let Ok(b) = pb::EventBatch::decode(data) {
        let mut d = BatchDecoder::new();
        decode(&mut d, &b, &mut None);
    }
    let mut d = BatchDecoder::new();
    let mut last = None;
    let mut buf = data;
    for _ in 0..MAX_BATCHES {
        if buf.is_empty() {
            break;
        }
        match pb::EventBatch::decode_length_delimited(&mut buf) {
            Ok(b) => decode(&mut d, &b, &mut last),
            Err(_) => break,
        }
    }
});
