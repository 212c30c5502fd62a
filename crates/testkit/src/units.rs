//! What DynamoDB would bill for the calls a client makes, which the
//! emulator does not report: write request units from each written item as
//! it was before and after the write (and from its entries in the table's
//! indexes), read request units from what each read returned. An SDK
//! interceptor; it reads the items it needs through a client of its own.
//!
//! Billing rules (on-demand, as AWS documents them):
//! - a write costs 1 unit per KB of the larger of the item before and after,
//!   rounded up (at least 1); 2 per KB in a transaction; a condition check in
//!   a transaction costs as a write of the item; a single write refused by
//!   its condition costs as if made; a transaction canceled costs nothing
//!   here (AWS bills what it read, which this does not know);
//! - each index a write changes costs 1 unit per KB of its entry: one when
//!   the entry is added, removed or changed in place, two when its key moves
//!   (never doubled for a transaction), none when the entry stays as it was;
//! - a read costs 1 unit per 4 KB, rounded up (at least 1); half when
//!   eventually consistent (every index query); a `Query` by the total size
//!   of the items it returned (a filter's dropped items are not seen here:
//!   no query of this service filters), a `BatchGetItem` item by item.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::{AttributeValue, ProjectionType};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    AfterDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};

type Item = HashMap<String, AttributeValue>;

/// Units billed, by where.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Units {
    /// Write units of the table's items.
    pub table_writes: u64,
    /// Write units of each index's entries, by index name.
    pub index_writes: BTreeMap<String, u64>,
    pub reads: f64,
}

impl Units {
    pub fn writes(&self) -> u64 {
        self.table_writes + self.index_writes.values().sum::<u64>()
    }

    /// `6 + gsi1 2 + gsi2 1 = 9` (the table's units, each index's, the
    /// total), or the table's alone when no index was written.
    pub fn writes_shown(&self) -> String {
        let mut shown = self.table_writes.to_string();
        for (index, units) in self.index_writes.iter().filter(|(_, units)| **units > 0) {
            shown.push_str(&format!(" + {index} {units}"));
        }
        if self.writes() > self.table_writes {
            shown.push_str(&format!(" = {}", self.writes()));
        }
        shown
    }

    pub fn add(&mut self, other: &Units) {
        self.table_writes += other.table_writes;
        for (index, units) in &other.index_writes {
            *self.index_writes.entry(index.clone()).or_default() += units;
        }
        self.reads += other.reads;
    }
}

/// Which attributes an index entry holds beside the keys.
#[derive(Debug, Clone)]
enum Projection {
    All,
    Keys,
    Include(Vec<String>),
}

#[derive(Debug, Clone)]
struct Index {
    name: String,
    keys: Vec<String>,
    projection: Projection,
}

/// The meter: add it to a DynamoDB client's configuration as an
/// interceptor, then [`UnitMeter::take`] what was billed since the last take.
#[derive(Clone)]
pub struct UnitMeter {
    table: String,
    table_keys: Vec<String>,
    indexes: Vec<Index>,
    /// Reads items as they are, without this meter.
    images: Client,
    billed: Arc<Mutex<Units>>,
}

impl std::fmt::Debug for UnitMeter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnitMeter").field("table", &self.table).finish()
    }
}

/// A write's items, read before it was sent.
#[derive(Debug, Clone)]
struct Before {
    transaction: bool,
    writes: Vec<(Item, Option<Item>)>,
}

impl Storable for Before {
    type Storer = StoreReplace<Self>;
}

impl UnitMeter {
    /// Meters calls on `table` as `images` (a client without this meter)
    /// describes it.
    pub async fn new(images: Client, table: &str) -> Self {
        let described = images.describe_table().table_name(table).send().await.expect("the table exists");
        let description = described.table.expect("a table");
        let key_names = |schema: &[aws_sdk_dynamodb::types::KeySchemaElement]| {
            schema.iter().map(|key| key.attribute_name().to_owned()).collect::<Vec<_>>()
        };
        let table_keys = key_names(description.key_schema());
        let indexes = description
            .global_secondary_indexes()
            .iter()
            .map(|index| {
                let projection = index.projection().expect("a projection");
                Index {
                    name: index.index_name().unwrap_or_default().to_owned(),
                    keys: key_names(index.key_schema()),
                    projection: match projection.projection_type() {
                        Some(ProjectionType::All) => Projection::All,
                        Some(ProjectionType::Include) => Projection::Include(projection.non_key_attributes().to_vec()),
                        _ => Projection::Keys,
                    },
                }
            })
            .collect();
        UnitMeter { table: table.to_owned(), table_keys, indexes, images, billed: Arc::default() }
    }

    /// What was billed since the last take.
    pub fn take(&self) -> Units {
        std::mem::take(&mut *crate::lock(&self.billed))
    }

    fn bill(&self, units: Units) {
        crate::lock(&self.billed).add(&units);
    }

    /// The item as it is now (a consistent read, unmetered).
    fn image(&self, key: &Item) -> Option<Item> {
        let read = self.images.get_item().table_name(&self.table).set_key(Some(key.clone())).consistent_read(true);
        let read = async { read.send().await.expect("the meter reads the item") };
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(read)).item
    }

    /// The index's entry for `item`, if the item has the index's keys.
    fn entry(&self, index: &Index, item: &Item) -> Option<Item> {
        if !index.keys.iter().all(|key| item.contains_key(key)) {
            return None;
        }
        let kept = |name: &String| {
            index.keys.contains(name)
                || self.table_keys.contains(name)
                || match &index.projection {
                    Projection::All => true,
                    Projection::Keys => false,
                    Projection::Include(names) => names.contains(name),
                }
        };
        Some(item.iter().filter(|(name, _)| kept(name)).map(|(name, value)| (name.clone(), value.clone())).collect())
    }

    /// The units of one write of an item from `before` to `after`.
    fn write(&self, before: Option<&Item>, after: Option<&Item>, transaction: bool) -> Units {
        let larger = before.map_or(0, item_size).max(after.map_or(0, item_size));
        let mut units =
            Units { table_writes: write_units(larger) * if transaction { 2 } else { 1 }, ..Units::default() };
        for index in &self.indexes {
            let old = before.and_then(|item| self.entry(index, item));
            let new = after.and_then(|item| self.entry(index, item));
            let billed = match (&old, &new) {
                (None, None) => 0,
                (Some(entry), None) | (None, Some(entry)) => write_units(item_size(entry)),
                (Some(old), Some(new)) if old == new => 0,
                (Some(old), Some(new)) if index.keys.iter().all(|key| old.get(key) == new.get(key)) => {
                    write_units(item_size(new))
                }
                (Some(old), Some(new)) => write_units(item_size(old)) + write_units(item_size(new)),
            };
            units.index_writes.insert(index.name.clone(), billed);
        }
        units
    }

    /// The keys (as items of key attributes) a write request writes.
    fn written_keys(&self, operation: &str, body: &serde_json::Value) -> Vec<Item> {
        let key_of = |attributes: &serde_json::Value| -> Item {
            self.table_keys
                .iter()
                .filter_map(|name| {
                    let text = attributes.get(name)?.get("S")?.as_str()?;
                    Some((name.clone(), AttributeValue::S(text.to_owned())))
                })
                .collect()
        };
        match operation {
            "PutItem" => vec![key_of(&body["Item"])],
            "UpdateItem" | "DeleteItem" => vec![key_of(&body["Key"])],
            "TransactWriteItems" => body["TransactItems"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|write| {
                    let (kind, request) = write.as_object()?.iter().next()?;
                    Some(if kind == "Put" { key_of(&request["Item"]) } else { key_of(&request["Key"]) })
                })
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// DynamoDB's size of an item: each attribute's name and value.
fn item_size(item: &Item) -> u64 {
    item.iter().map(|(name, value)| name.len() as u64 + value_size(value)).sum()
}

fn value_size(value: &AttributeValue) -> u64 {
    match value {
        AttributeValue::S(text) => text.len() as u64,
        // Numbers: about one byte per two significant digits, and one.
        AttributeValue::N(number) => {
            let digits = number.trim_start_matches('-').replace('.', "");
            (digits.trim_start_matches('0').len() as u64).div_ceil(2) + 1
        }
        AttributeValue::B(bytes) => bytes.as_ref().len() as u64,
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(texts) => texts.iter().map(|text| text.len() as u64).sum(),
        AttributeValue::Ns(numbers) => {
            numbers.iter().map(|number| value_size(&AttributeValue::N(number.clone()))).sum()
        }
        AttributeValue::Bs(blobs) => blobs.iter().map(|blob| blob.as_ref().len() as u64).sum(),
        AttributeValue::L(values) => 3 + values.iter().map(|value| 1 + value_size(value)).sum::<u64>(),
        AttributeValue::M(map) => {
            3 + map.iter().map(|(name, value)| 1 + name.len() as u64 + value_size(value)).sum::<u64>()
        }
        _ => 0,
    }
}

fn write_units(bytes: u64) -> u64 {
    bytes.div_ceil(1024).max(1)
}

fn read_units(bytes: u64, consistent: bool) -> f64 {
    let units = bytes.div_ceil(4096).max(1) as f64;
    if consistent { units } else { units / 2.0 }
}

fn operation_of(target: &str) -> &str {
    target.rsplit('.').next().unwrap_or_default()
}

/// The request as it was sent, for the answer's turn.
#[derive(Debug, Clone)]
struct Sent {
    operation: String,
    consistent: bool,
    /// The keys a `BatchGetItem` asked for (each costs a unit, found or not).
    asked: usize,
}

impl Storable for Sent {
    type Storer = StoreReplace<Self>;
}

impl Intercept for UnitMeter {
    fn name(&self) -> &'static str {
        "UnitMeter"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let operation = operation_of(context.request().headers().get("x-amz-target").unwrap_or_default()).to_owned();
        let body: serde_json::Value =
            context.request().body().bytes().and_then(|bytes| serde_json::from_slice(bytes).ok()).unwrap_or_default();
        let consistent = body["ConsistentRead"].as_bool().unwrap_or(false)
            || body["RequestItems"].as_object().is_some_and(|tables| {
                tables.values().all(|request| request["ConsistentRead"].as_bool().unwrap_or(false))
            });
        let writes = self.written_keys(&operation, &body);
        if !writes.is_empty() {
            let transaction = operation == "TransactWriteItems";
            let writes = writes.into_iter().map(|key| (key.clone(), self.image(&key))).collect();
            cfg.interceptor_state().store_put(Before { transaction, writes });
        }
        let asked = body["RequestItems"]
            .as_object()
            .map_or(0, |tables| tables.values().map(|request| request["Keys"].as_array().map_or(0, Vec::len)).sum());
        cfg.interceptor_state().store_put(Sent { operation, consistent, asked });
        Ok(())
    }

    fn read_after_deserialization(
        &self,
        context: &AfterDeserializationInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(sent) = cfg.load::<Sent>().cloned() else { return Ok(()) };
        let succeeded = context.output_or_error().is_ok();
        if let Some(before) = cfg.load::<Before>().cloned() {
            if succeeded || !before.transaction {
                for (key, old) in &before.writes {
                    let new = if succeeded { self.image(key) } else { old.clone() };
                    self.bill(self.write(old.as_ref(), new.as_ref(), before.transaction));
                }
            }
            return Ok(());
        }
        let Ok(output) = context.output_or_error() else { return Ok(()) };
        use aws_sdk_dynamodb::operation::{batch_get_item, get_item, query};
        let reads = match sent.operation.as_str() {
            "GetItem" => output
                .downcast_ref::<get_item::GetItemOutput>()
                .map(|read| read_units(read.item().map_or(0, item_size), sent.consistent)),
            "Query" => output
                .downcast_ref::<query::QueryOutput>()
                .map(|read| read_units(read.items().iter().map(item_size).sum(), sent.consistent)),
            "BatchGetItem" => output.downcast_ref::<batch_get_item::BatchGetItemOutput>().map(|read| {
                let found: Vec<&Item> =
                    read.responses().into_iter().flat_map(|tables| tables.values().flatten()).collect();
                let missing = sent.asked.saturating_sub(found.len()) as f64 * read_units(0, sent.consistent);
                found.into_iter().map(|item| read_units(item_size(item), sent.consistent)).sum::<f64>() + missing
            }),
            _ => None,
        };
        if let Some(reads) = reads {
            self.bill(Units { reads, ..Units::default() });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_units_follow_dynamodbs_rules() {
        let item: Item = [
            ("pk".to_owned(), AttributeValue::S("RUN#x".into())),
            ("n".to_owned(), AttributeValue::N("-12.30".into())),
            ("ok".to_owned(), AttributeValue::Bool(true)),
            ("l".to_owned(), AttributeValue::L(vec![AttributeValue::S("ab".into())])),
        ]
        .into();
        // pk 2 + 5; n 1 + (4 significant digits: 2) + 1; ok 2 + 1; l 1 + 3 + (1 + 2).
        assert_eq!(item_size(&item), 7 + 4 + 3 + 7);
        assert_eq!((write_units(0), write_units(1024), write_units(1025)), (1, 1, 2));
        assert_eq!((read_units(4097, true), read_units(1, false)), (2.0, 0.5));
    }
}
