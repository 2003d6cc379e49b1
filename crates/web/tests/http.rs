//! Every documented error code triggered over real HTTP on loopback; the server keeps serving.

use bytes::Bytes;
use proptest::prelude::*;
use serde_json::Value;
use web::api::{ErrorCode, SizeLimits};
use web::client::JsonClient;
use web::exec::{ExecConfig, Model};
use web::server::{ServeBounds, Server, ServerConfig};
use web::workload::Shape;

const EXAMPLE: &str = r#"{"requestId": 2238, "matrixOne": {"columnCount": 3, "rows": [{"value": "1,2,3"},
    {"value": "4,5,6"}]}, "matrixTwo": {"columnCount": 2, "rows": [{"value": "7,8"},
    {"value": "9,10"}, {"value": "11,12"}]}}"#;

const BODY_BYTES_MAX: usize = 1 << 20;

fn start(queue_depth_max: usize, workers: usize) -> Server {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let config = ServerConfig {
        default_model: Model::Pinned,
        exec: ExecConfig {
            limits: SizeLimits { dim_max: 1000, cells_max: 100_000, ..SizeLimits::default() },
            workers,
            queue_depth_max,
        },
        body_bytes_max: BODY_BYTES_MAX,
        io_threads: 2,
        bounds: ServeBounds::default(),
    };
    Server::start(listener, config).unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

async fn post(
    client: &JsonClient,
    server: &Server,
    path: &str,
    body: impl Into<Bytes>,
) -> (u16, Value) {
    let url = format!("http://{}{path}", server.local_addr());
    let (status, body) = client.post(&url, body.into()).await.unwrap();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

#[test]
fn published_example_on_every_route() {
    let server = start(16, 2);
    let client = JsonClient::default();
    runtime().block_on(async {
        for path in
            ["/matrix", "/matrix/single", "/matrix/pool", "/matrix/pinned", "/matrix/adaptive"]
        {
            let (status, json) = post(&client, &server, path, EXAMPLE).await;
            assert_eq!(status, 200, "{path}");
            assert_eq!(
                json,
                serde_json::json!({"requestId": "2238", "rows": [[58, 64], [139, 154]]}),
                "{path}"
            );
        }
    });
}

#[test]
fn every_error_code_over_http_then_still_serving() {
    let server = start(16, 2);
    let client = JsonClient::default();
    let huge_rows = "{\"value\":\"1\"},".repeat(1001);
    let cases: Vec<(String, ErrorCode)> = vec![
        (
            EXAMPLE.replace("\"9,10\"}, {\"value\": \"11,12\"}", "\"9,10\"}"),
            ErrorCode::ShapeMismatch,
        ),
        ("{\"requestId\": 5, \"matrixOne\": [".into(), ErrorCode::MalformedJson),
        (EXAMPLE.replace("\"matrixTwo\"", "\"matrixTwoo\""), ErrorCode::MissingField),
        (EXAMPLE.replace("\"7,8\"", "\"7,eight\""), ErrorCode::NonNumericCell),
        (EXAMPLE.replace("\"4,5,6\"", "\"4,5\""), ErrorCode::RowLength),
        (
            format!(
                "{{\"requestId\":1,\"matrixOne\":{{\"columnCount\":1,\"rows\":[{huge_rows}{{\"value\":\"1\"}}]}},\"matrixTwo\":{{\"columnCount\":1,\"rows\":[{{\"value\":\"1\"}}]}}}}"
            ),
            ErrorCode::TooLarge,
        ),
        (" ".repeat(BODY_BYTES_MAX + 1), ErrorCode::BodyTooLarge),
        (EXAMPLE.replace("\"1,2,3\"", "\"9223372036854775807,2,3\""), ErrorCode::Overflow),
    ];
    runtime().block_on(async {
        for (body, code) in &cases {
            let (status, json) = post(&client, &server, "/matrix", body.clone()).await;
            assert_eq!(status, code.http_status(), "{code:?}: {json}");
            assert_eq!(json["errorCode"], code.code(), "{json}");
            assert!(json["errorMessage"].as_str().is_some_and(|m| !m.is_empty()));
        }
        let (status, json) = post(&client, &server, "/matrix", EXAMPLE).await;
        assert_eq!((status, &json["requestId"]), (200, &Value::from("2238")));
    });
    let shape_mismatch = cases.iter().find(|(_, code)| *code == ErrorCode::ShapeMismatch).unwrap();
    let json = runtime().block_on(post(&client, &server, "/matrix", shape_mismatch.0.clone())).1;
    assert_eq!(json["requestId"], 2238, "a failure echoes the id as sent");
    assert_eq!(json["errorMessage"], "Invalid number of columns and rows for multiplication");
}

#[test]
fn full_queue_answers_busy_and_recovers() {
    // One worker, one waiting slot: a burst of slow requests must overflow the bound.
    let server = start(1, 1);
    let client = JsonClient::default();
    let body = Bytes::from(Shape { rows_a: 1000, inner: 50, cols_b: 20 }.request_body(1, 1));
    runtime().block_on(async {
        let burst: Vec<_> = (0..24)
            .map(|_| {
                let (client, body) = (client.clone(), body.clone());
                let url = format!("http://{}/matrix/single", server.local_addr());
                tokio::spawn(async move { client.post(&url, body).await.unwrap() })
            })
            .collect();
        let mut statuses = Vec::new();
        for task in burst {
            let (status, body) = task.await.unwrap();
            if status == 503 {
                let json: Value = serde_json::from_slice(&body).unwrap();
                assert_eq!(json["errorCode"], ErrorCode::Busy.code());
            }
            statuses.push(status);
        }
        assert!(statuses.contains(&503), "{statuses:?}");
        assert!(statuses.iter().all(|&s| s == 200 || s == 503), "{statuses:?}");
        let (status, _) = post(&client, &server, "/matrix/single", EXAMPLE).await;
        assert_eq!(status, 200);
    });
}

/// One server for all property cases (start-up includes the adaptive calibration).
static SHARED_SERVER: std::sync::LazyLock<Server> = std::sync::LazyLock::new(|| start(16, 2));

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random bytes and random JSON-ish bodies: always a documented JSON answer, never a hang,
    /// and the server answers the published example afterwards.
    #[test]
    fn random_bodies_never_break_the_server(
        bodies in proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..200),
                "\\{\"requestId\":[0-9]{1,3},\"matrixOne\":\\{\"columnCount\":[0-9],\"rows\":\\[(\\{\"value\":\"[0-9,a ]{0,8}\"\\},?){0,4}\\]\\}\\}".prop_map(String::into_bytes),
            ],
            1..6,
        )
    ) {
        let server = &*SHARED_SERVER;
        let client = JsonClient::default();
        runtime().block_on(async {
            for body in bodies {
                let (status, json) = post(&client, server, "/matrix/adaptive", body).await;
                prop_assert!(matches!(status, 200 | 400 | 413 | 422), "{status}");
                if status != 200 {
                    let code = json["errorCode"].as_str().unwrap_or_default().to_string();
                    prop_assert!(ErrorCode::ALL.iter().any(|c| c.code() == code), "{json}");
                }
            }
            let (status, _) = post(&client, server, "/matrix/adaptive", EXAMPLE).await;
            prop_assert_eq!(status, 200);
            Ok(())
        })?;
    }
}

/// A client that sends all of a refused body before it reads reads the 413, not a reset: the
/// server reads the rest of the body before it answers, whether the body declared its length
/// (refused before reading; a pause between the head and the body gives a server that answered
/// at once the time to close the connection) or came in chunks (refused once past the bound).
#[test]
fn refused_body_is_read_before_the_answer() {
    use std::io::{Read, Write};
    let server = start(16, 2);
    let body_bytes = BODY_BYTES_MAX + 1;
    let chunk_head = format!("{body_bytes:x}\r\n").into_bytes();
    let chunked_body = [chunk_head, vec![b' '; body_bytes], b"\r\n0\r\n\r\n".to_vec()].concat();
    let framings = [
        (format!("content-length: {body_bytes}"), vec![b' '; body_bytes]),
        ("transfer-encoding: chunked".to_string(), chunked_body),
    ];
    for (framing, body) in framings {
        let mut stream = std::net::TcpStream::connect(server.local_addr()).unwrap();
        let head = format!(
            "POST /matrix HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\n\
             connection: close\r\n{framing}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        stream.write_all(&body).unwrap_or_else(|e| panic!("{framing}: body refused early: {e}"));
        let mut answer = String::new();
        stream.read_to_string(&mut answer).unwrap_or_else(|e| panic!("{framing}: {e}"));
        assert!(answer.starts_with("HTTP/1.1 413"), "{framing}: {answer}");
        let code = format!("\"errorCode\":\"{}\"", ErrorCode::BodyTooLarge.code());
        assert!(answer.contains(&code), "{framing}: {answer}");
    }
}
