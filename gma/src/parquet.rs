//! The Parquet file of `gma archive export --format parquet` (docs/parquet.md).
//!
//! Long layout, one row per sample: `time` (timestamp, ns, UTC), `name`, `source`, `field`
//! (strings, dictionary-encoded in the file), `value` (double, null for a text field) and
//! `text` (string, null for a numeric field). A long table holds any mix of events and fields
//! in one schema (a wide one would need a column per field of every event exported, mostly
//! null, and could not stream before knowing them all); DuckDB and pandas pivot it in one call
//! (`PIVOT … ON field USING first(value)`, `DataFrame.pivot_table`).
//!
//! Memory is bounded whatever the export's size: rows are buffered into Arrow record batches
//! of [`BATCH_ROWS`], each handed to the Parquet writer, which holds at most one row group
//! ([`ROW_GROUP_ROWS`] rows or [`ROW_GROUP_BYTES`] encoded, whichever comes first) before
//! writing it out.

use std::io::Write;
use std::sync::Arc;

use arrow_array::builder::{Float64Builder, StringBuilder, TimestampNanosecondBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef, TimeUnit};
use gma_proto::v1 as pb;
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

/// Rows per Arrow record batch handed to the writer.
pub const BATCH_ROWS: usize = 64 * 1024;
/// Most rows of one row group.
pub const ROW_GROUP_ROWS: usize = 1024 * 1024;
/// Most encoded bytes of one row group held before it is written.
pub const ROW_GROUP_BYTES: usize = 64 << 20;

/// The file's Arrow schema (stored in the file, so pyarrow restores the types exactly).
pub fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new(
            "time",
            DataType::Timestamp(TimeUnit::Nanosecond, Some("UTC".into())),
            false,
        ),
        Field::new("name", DataType::Utf8, false),
        Field::new("source", DataType::Utf8, false),
        Field::new("field", DataType::Utf8, false),
        Field::new("value", DataType::Float64, true),
        Field::new("text", DataType::Utf8, true),
    ]))
}

/// Writes samples as they stream in; [`ParquetSink::finish`] writes the footer.
pub struct ParquetSink<W: Write + Send> {
    writer: ArrowWriter<W>,
    schema: SchemaRef,
    time: TimestampNanosecondBuilder,
    name: StringBuilder,
    source: StringBuilder,
    field: StringBuilder,
    value: Float64Builder,
    text: StringBuilder,
    rows: usize,
}

impl<W: Write + Send> ParquetSink<W> {
    pub fn new(out: W) -> parquet::errors::Result<Self> {
        let schema = schema();
        // Dictionary encoding for the repeated strings only: timestamps and values rarely
        // repeat, and a dictionary of them would be written and then abandoned per page.
        let props = WriterProperties::builder()
            .set_compression(Compression::SNAPPY)
            .set_max_row_group_row_count(Some(ROW_GROUP_ROWS))
            .set_max_row_group_bytes(Some(ROW_GROUP_BYTES))
            .set_dictionary_enabled(true)
            .set_column_dictionary_enabled(ColumnPath::from("time"), false)
            .set_column_dictionary_enabled(ColumnPath::from("value"), false)
            .set_created_by(format!("gma {}", env!("CARGO_PKG_VERSION")))
            .build();
        let writer = ArrowWriter::try_new(out, schema.clone(), Some(props))?;
        Ok(ParquetSink {
            writer,
            time: TimestampNanosecondBuilder::with_capacity(BATCH_ROWS).with_timezone("UTC"),
            name: StringBuilder::new(),
            source: StringBuilder::new(),
            field: StringBuilder::new(),
            value: Float64Builder::with_capacity(BATCH_ROWS),
            text: StringBuilder::new(),
            schema,
            rows: 0,
        })
    }

    /// Appends the samples of one response piece; returns how many.
    pub fn push(&mut self, p: &pb::SeriesPoints) -> parquet::errors::Result<u64> {
        for (i, &ts) in p.timestamps_ns.iter().enumerate() {
            self.time.append_value(ts);
            self.name.append_value(&p.name);
            self.source.append_value(&p.source);
            self.field.append_value(&p.field);
            self.value.append_option(p.values.get(i).copied());
            match p.texts.get(i) {
                Some(t) if p.values.get(i).is_none() => self.text.append_value(t),
                _ => self.text.append_null(),
            }
            self.rows += 1;
            if self.rows == BATCH_ROWS {
                self.write_batch()?;
            }
        }
        Ok(p.timestamps_ns.len() as u64)
    }

    fn write_batch(&mut self) -> parquet::errors::Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.time.finish()),
            Arc::new(self.name.finish()),
            Arc::new(self.source.finish()),
            Arc::new(self.field.finish()),
            Arc::new(self.value.finish()),
            Arc::new(self.text.finish()),
        ];
        self.rows = 0;
        let batch = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.writer.write(&batch)
    }

    /// Writes the last rows and the footer.
    pub fn finish(mut self) -> parquet::errors::Result<W> {
        self.write_batch()?;
        self.writer.into_inner()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    fn piece(name: &str, field: &str, n: usize, text: bool) -> pb::SeriesPoints {
        pb::SeriesPoints {
            name: name.into(),
            source: "h1".into(),
            field: field.into(),
            timestamps_ns: (0..n as i64).map(|i| 1_700_000_000_000_000_000 + i).collect(),
            values: if text {
                Vec::new()
            } else {
                (0..n).map(|i| i as f64 / 2.0).collect()
            },
            texts: if text {
                (0..n).map(|i| format!("t{i}")).collect()
            } else {
                Vec::new()
            },
        }
    }

    #[test]
    fn rows_cross_batches_and_row_groups_and_read_back() -> anyhow::Result<()> {
        let mut sink = ParquetSink::new(tempfile::tempfile()?)?;
        let n = BATCH_ROWS + 10;
        assert_eq!(sink.push(&piece("a.b", "x", n, false))?, n as u64);
        assert_eq!(sink.push(&piece("a.c", "s", 3, true))?, 3);
        let r = SerializedFileReader::new(sink.finish()?)?;
        let meta = r.metadata();
        let rows: i64 = meta.row_groups().iter().map(|g| g.num_rows()).sum();
        assert_eq!(rows, n as i64 + 3);
        let cols: Vec<_> = meta
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        assert_eq!(cols, ["time", "name", "source", "field", "value", "text"]);
        // The string columns are dictionary-encoded.
        let g = meta.row_group(0);
        assert!(g.column(1).dictionary_page_offset().is_some());
        assert!(g.column(4).dictionary_page_offset().is_none());
        Ok(())
    }
}
