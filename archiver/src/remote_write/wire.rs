//! The remote-write 1.0 body: a `prometheus.WriteRequest` (the few messages of Prometheus'
//! `prompb/remote.proto` and `types.proto` it needs, declared with prost) compressed as one
//! snappy *block* (not the framed format).

use super::batch::Batch;
use crate::promlabels;

/// `prometheus.WriteRequest` (field numbers of prompb/remote.proto; metadata, field 3, unused).
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRequest {
    #[prost(message, repeated, tag = "1")]
    pub timeseries: Vec<TimeSeries>,
}

/// `prometheus.TimeSeries` (exemplars and histograms unused).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TimeSeries {
    /// Sorted by name.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<Sample>,
}

/// `prometheus.Label`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `prometheus.Sample`: a value at a timestamp in milliseconds since the epoch.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Sample {
    #[prost(double, tag = "1")]
    pub value: f64,
    #[prost(int64, tag = "2")]
    pub timestamp: i64,
}

/// The request of `batch`: one time series per archived series, labels from
/// [`crate::promlabels`] (sorted by name, as the protocol requires).
pub fn request(batch: &Batch) -> WriteRequest {
    WriteRequest {
        timeseries: batch
            .series
            .iter()
            .filter(|s| !s.samples.is_empty())
            .map(|s| TimeSeries {
                labels: promlabels::labels(&s.key.event, &s.key.source, &s.key.field)
                    .into_iter()
                    .map(|(name, value)| Label {
                        name: name.to_string(),
                        value,
                    })
                    .collect(),
                samples: s
                    .samples
                    .iter()
                    .map(|&(timestamp, value)| Sample { value, timestamp })
                    .collect(),
            })
            .collect(),
    }
}

/// The HTTP body of `batch`: the encoded request, snappy block-compressed.
pub fn body(batch: &Batch) -> Result<Vec<u8>, super::RemoteWriteError> {
    let raw = prost::Message::encode_to_vec(&request(batch));
    Ok(snap::raw::Encoder::new().compress_vec(&raw)?)
}

#[cfg(test)]
mod tests {
    use super::super::batch::{SeriesBatch, SeriesKey};
    use super::*;

    #[test]
    fn the_body_decodes_back_to_the_batch_with_sorted_labels() {
        let batch = Batch {
            series: vec![SeriesBatch {
                key: SeriesKey {
                    event: "host.load".into(),
                    source: "hostA".into(),
                    field: "load1".into(),
                },
                samples: vec![(1_700_000_000_000, 1.5), (1_700_000_000_001, f64::NAN)],
            }],
        };
        let body = body(&batch).unwrap();
        let raw = snap::raw::Decoder::new().decompress_vec(&body).unwrap();
        let req: WriteRequest = prost::Message::decode(&raw[..]).unwrap();
        assert_eq!(req.timeseries.len(), 1);
        let ts = &req.timeseries[0];
        let names: Vec<_> = ts.labels.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, ["__name__", "event", "field", "source"]);
        assert_eq!(ts.labels[0].value, "host_load_load1");
        assert_eq!(ts.labels[3].value, "hostA");
        assert_eq!(
            ts.samples[0],
            Sample {
                value: 1.5,
                timestamp: 1_700_000_000_000
            }
        );
        assert!(ts.samples[1].value.is_nan());
    }

    /// Field numbers and wire types against a hand-encoded message (the stdlib sender of the
    /// project's notes on Prometheus, verified against Prometheus 2.42).
    #[test]
    fn encoding_matches_the_hand_written_reference() {
        let req = WriteRequest {
            timeseries: vec![TimeSeries {
                labels: vec![Label {
                    name: "a".into(),
                    value: "b".into(),
                }],
                samples: vec![Sample {
                    value: 42.5,
                    timestamp: 5,
                }],
            }],
        };
        let mut want = vec![
            0x0a, 0x15, 0x0a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b', 0x12, 0x0b, 0x09,
        ];
        want.extend_from_slice(&42.5f64.to_le_bytes());
        want.extend_from_slice(&[0x10, 0x05]);
        assert_eq!(prost::Message::encode_to_vec(&req), want);
    }
}
