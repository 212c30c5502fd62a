//! A stand-in for an OpenTelemetry collector: answers OTLP/HTTP trace
//! exports (`POST /v1/traces`, protobuf) and keeps the spans, decoded with
//! the `opentelemetry-proto` types.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;

/// One span as received, with what the tests look at.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// `SPAN_KIND_SERVER` and so on.
    pub kind: String,
    pub start_nanos: u64,
    pub end_nanos: u64,
    pub attributes: BTreeMap<String, String>,
    /// The status code's name (`STATUS_CODE_ERROR` for a failed span).
    pub status: String,
    pub service_name: String,
}

impl ReceivedSpan {
    pub fn attribute(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

pub struct Collector {
    pub endpoint: String,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

impl Collector {
    pub fn start() -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let kept = kept.clone();
                std::thread::spawn(move || serve(stream, &kept));
            }
        });
        Collector { endpoint, spans }
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits until `done` holds for the spans received.
    #[track_caller]
    pub fn wait_for(&self, timeout: Duration, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if done(&spans) {
                return spans;
            }
            assert!(Instant::now() < deadline, "spans never arrived; received: {spans:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// HTTP/1.1 with keep-alive, as the exporter sends.
fn serve(stream: TcpStream, spans: &Mutex<Vec<ReceivedSpan>>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        assert!(request_line.starts_with("POST /v1/traces "), "{request_line}");
        let export = ExportTraceServiceRequest::decode(body.as_slice()).expect("an OTLP trace export");
        spans.lock().unwrap().extend(decode(export));
        let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        writer.write_all(answer.as_bytes()).unwrap();
    }
}

fn text(value: Option<&AnyValue>) -> String {
    match value {
        Some(AnyValue::StringValue(text)) => text.clone(),
        Some(AnyValue::IntValue(number)) => number.to_string(),
        Some(AnyValue::BoolValue(flag)) => flag.to_string(),
        Some(AnyValue::DoubleValue(number)) => number.to_string(),
        Some(AnyValue::ArrayValue(array)) => {
            let items: Vec<String> = array.values.iter().map(|item| text(item.value.as_ref())).collect();
            items.join(",")
        }
        _ => String::new(),
    }
}

fn decode(export: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut found = Vec::new();
    for resource_spans in export.resource_spans {
        let service_name = resource_spans
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .find(|attribute| attribute.key == "service.name")
            .map(|attribute| text(attribute.value.as_ref().and_then(|value| value.value.as_ref())))
            .unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                let kind = opentelemetry_proto::tonic::trace::v1::span::SpanKind::try_from(span.kind)
                    .map(|kind| kind.as_str_name().to_owned())
                    .unwrap_or_default();
                let status = span
                    .status
                    .as_ref()
                    .and_then(|status| {
                        opentelemetry_proto::tonic::trace::v1::status::StatusCode::try_from(status.code).ok()
                    })
                    .map(|code| code.as_str_name().to_owned())
                    .unwrap_or_default();
                found.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind,
                    start_nanos: span.start_time_unix_nano,
                    end_nanos: span.end_time_unix_nano,
                    attributes: span
                        .attributes
                        .iter()
                        .map(|attribute| {
                            (attribute.key.clone(), text(attribute.value.as_ref().and_then(|v| v.value.as_ref())))
                        })
                        .collect(),
                    status,
                    service_name: service_name.clone(),
                });
            }
        }
    }
    found
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}
