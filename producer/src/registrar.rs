//! Keeps the producer's record in the directory: the generic lease keeping of
//! [`gma_consumer::registrar`] with the hub as the catalog (event names with their schemas and
//! sources; a new name or source bumps the hub's catalog version and the record is updated).

use std::sync::Arc;

use gma_consumer::registrar::{self, Catalog};
use gma_proto::v1 as pb;
use tokio::sync::watch;

use crate::error::Error;
use crate::hub::Hub;

/// What the registrar registers.
#[derive(Debug, Clone)]
pub struct Registration {
    pub directory: String,
    pub id: String,
    pub address: String,
    pub ttl_ms: u64,
    pub site: String,
    pub org: String,
    /// The record's attributes (the SNMP devices and statistics this producer polls).
    pub attributes: std::collections::BTreeMap<String, String>,
}

struct ProducerCatalog {
    reg: Registration,
    hub: Arc<Hub>,
}

impl Catalog for ProducerCatalog {
    fn version(&self) -> u64 {
        self.hub.lock().catalog_version
    }

    fn record(&self) -> (pb::Record, Vec<pb::EventSchema>, u64) {
        let inner = self.hub.lock();
        let mut schemas: Vec<pb::EventSchema> = inner.schemas().cloned().collect();
        schemas.sort_by(|a, b| a.name.cmp(&b.name));
        let events = schemas.iter().map(|s| s.name.clone()).collect();
        let sources = inner.sources().map(str::to_string).collect();
        let version = inner.catalog_version;
        drop(inner);
        let producer = pb::ProducerRecord {
            id: self.reg.id.clone(),
            address: self.reg.address.clone(),
            events,
            sources,
            services: [
                "query",
                "subscribe",
                "resume",
                "ingest",
                "push",
                "filters",
                "summaries",
                "forecast",
            ]
            .map(String::from)
            .to_vec(),
            site: self.reg.site.clone(),
            org: self.reg.org.clone(),
            attributes: self.reg.attributes.clone().into_iter().collect(),
        };
        (
            pb::Record {
                record: Some(pb::record::Record::Producer(producer)),
            },
            schemas,
            version,
        )
    }
}

/// Runs until `stop` flips; then removes the record (best effort). Ends early with the
/// directory's message when it refuses the first registration ([`registrar::run`]).
pub async fn run(reg: Registration, hub: Arc<Hub>, stop: watch::Receiver<bool>) -> Result<(), Error> {
    let r = registrar::Registration {
        directory: reg.directory.clone(),
        kind: pb::RecordKind::Producer,
        id: reg.id.clone(),
        ttl_ms: reg.ttl_ms,
    };
    registrar::run(r, Arc::new(ProducerCatalog { reg, hub }), stop)
        .await
        .map_err(|e| Error::Registration(e.to_string()))
}
