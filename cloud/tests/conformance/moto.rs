//! moto's server, started once per test process, and a fault-injecting HTTP proxy in front of
//! it that answers, on command, with EC2's real error bodies (capacity errors in CreateFleet's
//! `errorSet`, `RequestLimitExceeded`), so the SDK's real HTTP path and error parsing are tested.

use std::collections::HashSet;
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// The moto server of this test process.
pub struct Moto {
    pub addr: SocketAddr,
    /// The watchdog shell (moto's parent); it ends with this process.
    _watchdog: std::sync::Mutex<std::process::Child>,
}

/// Where moto's server is: `DOVETAIL_MOTO_SERVER`, else the checkout's `scripts/moto-server`
/// (moto's own, with its tag store locked: see `scripts/moto_server.py`) on the venv
/// `scripts/test` makes.
#[allow(clippy::disallowed_methods, reason = "the test harness finds its tools from the environment")]
fn moto_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("DOVETAIL_MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from).unwrap_or_default();
    // The workspace's root is the binary crate's own dir, or the parent of a member's.
    let wrapper = [manifest.join("scripts/moto-server"), manifest.join("../scripts/moto-server")]
        .into_iter()
        .find(|p| p.exists());
    wrapper.unwrap_or_else(|| {
        let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/root"));
        home.join(".cache/dovetail/venv/bin/moto_server")
    })
}

/// Starts moto on a free 127.0.0.1 port (once) and waits until it answers. A watchdog shell
/// kills it by pid when this test process exits.
pub fn moto() -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| {
        let bin = moto_binary();
        assert!(
            bin.exists(),
            "moto_server not found at {} (scripts/test installs it into ~/.cache/dovetail/venv; or set DOVETAIL_MOTO_SERVER)",
            bin.display()
        );
        let port = StdListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port").port();
        let log = std::env::temp_dir().join(format!("dovetail-moto-{port}.log"));
        let script = format!(
            "\"$0\" -H 127.0.0.1 -p {port} >{log} 2>&1 & m=$!; while kill -0 {parent} 2>/dev/null && kill -0 $m 2>/dev/null; do sleep 1; done; kill $m 2>/dev/null; wait $m",
            log = log.display(),
            parent = std::process::id(),
        );
        let watchdog = Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg(&bin)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        // Bounded by count: 300 tries of at most 200 ms, about a minute.
        let mut tries = 0;
        while StdStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            tries += 1;
            assert!(tries < 300, "moto_server did not listen on {addr} after 300 tries (up to a minute); see {}", log.display());
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto { addr, _watchdog: std::sync::Mutex::new(watchdog) }
    })
}

/// Runs one of a test's own setup calls against moto (seeding subnets, tags, images, queues),
/// asking again when moto answered a server error or the call never got an answer: 3 tries,
/// 100 ms then 400 ms apart. Only a test's setup is helped past an emulator's passing error
/// (moto under a loaded machine); the code under test keeps its own policy.
pub async fn setup<T, E, F, Fut>(what: &str, mut call: F) -> T
where
    E: std::error::Error + Send + Sync + 'static,
    F: FnMut() -> Fut,
    Fut: std::future::Future<
            Output = Result<T, aws_sdk_ec2::error::SdkError<E, aws_sdk_ec2::config::http::HttpResponse>>,
        >,
{
    use aws_sdk_ec2::error::SdkError;
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=3 {
        match call().await {
            Ok(v) => return v,
            Err(e) => {
                let passing = matches!(e, SdkError::DispatchFailure(_) | SdkError::TimeoutError(_))
                    || e.raw_response().is_some_and(|r| r.status().is_server_error());
                if !passing || attempt == 3 {
                    panic!("{what}: {}", aws_sdk_ec2::error::DisplayErrorContext(&e));
                }
                eprintln!("{what}: moto answered {}; asking again", aws_sdk_ec2::error::DisplayErrorContext(&e));
                tokio::time::sleep(pause).await;
                pause *= 4;
            }
        }
    }
    unreachable!("the third try returns or panics")
}

/// What the proxy does instead of forwarding.
#[derive(Default)]
pub struct Faults {
    /// (instance type, zone, `spot`/`on-demand`) without capacity.
    pub exhausted: HashSet<(String, String, String)>,
    /// How many of the next EC2 calls are answered `RequestLimitExceeded`.
    pub throttle_next: u32,
    /// Every action seen, in order, as IAM names them (`ec2:CreateFleet`).
    pub actions: Vec<String>,
    /// How many of the next CreateFleet calls moto carries out while the client gets a 500
    /// instead of the answer (a caller cut off after the fleet was made).
    pub lose_fleet_response: u32,
    /// Instances with termination protection: a TerminateInstances call naming one is refused
    /// whole (`OperationNotPermitted`), as EC2 does.
    pub protected: HashSet<String>,
    /// The spot price history DescribeSpotPriceHistory answers, as EC2 shapes it: (instance
    /// type, zone, price). moto's is a flat price for every type; unset, moto answers.
    pub spot_prices: Option<Vec<(String, String, f64)>>,
}

/// EC2's DescribeSpotPriceHistory answer for `prices`, each stamped now.
fn spot_history(prices: &[(String, String, f64)]) -> String {
    let mut items = String::new();
    for (instance_type, zone, price) in prices {
        items.push_str(&format!(
            "<item><instanceType>{instance_type}</instanceType><productDescription>Linux/UNIX</productDescription><spotPrice>{price:.6}</spotPrice><timestamp>2026-11-28T00:00:00.000Z</timestamp><availabilityZone>{zone}</availabilityZone></item>"
        ));
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<DescribeSpotPriceHistoryResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>00000000-0000-0000-0000-000000000003</requestId><spotPriceHistorySet>{items}</spotPriceHistorySet><nextToken></nextToken></DescribeSpotPriceHistoryResponse>"
    )
}

/// The proxy; its address is the SDK's endpoint.
pub struct Proxy {
    pub addr: SocketAddr,
    pub faults: Arc<Mutex<Faults>>,
}

impl Proxy {
    /// Starts a proxy to `upstream` on the current runtime.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let faults = Arc::new(Mutex::new(Faults::default()));
        let f = faults.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                let f = f.clone();
                tokio::spawn(async move {
                    let _ = handle(sock, upstream, f).await;
                });
            }
        });
        Proxy { addr, faults }
    }

    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many calls of `action` went through the proxy so far.
    pub fn calls(&self, action: &str) -> usize {
        self.faults().actions.iter().filter(|a| a.split(':').nth(1) == Some(action)).count()
    }

    /// How many calls of any action went through the proxy so far.
    pub fn total_calls(&self) -> usize {
        self.faults().actions.len()
    }
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(v) => {
                        out.push(v);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn form(body: &[u8]) -> Vec<(String, String)> {
    String::from_utf8_lossy(body)
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn response(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/xml;charset=UTF-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

const THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>";

/// An EC2 error answer.
fn ec2_error(code: &str, message: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    )
}

/// One override of a CreateFleet request: (config index, override index, type, zone, subnet).
struct Override {
    config: String,
    index: String,
    instance_type: String,
    zone: String,
    subnet: String,
    template: String,
}

fn overrides(f: &[(String, String)]) -> Vec<Override> {
    let mut out: Vec<Override> = Vec::new();
    for (k, v) in f {
        let parts: Vec<&str> = k.split('.').collect();
        if parts.len() == 5 && parts[0] == "LaunchTemplateConfigs" && parts[2] == "Overrides" {
            let (c, i) = (parts[1].to_string(), parts[3].to_string());
            let pos = match out.iter().position(|o| o.config == c && o.index == i) {
                Some(p) => p,
                None => {
                    let template = f
                        .iter()
                        .find(|(k2, _)| {
                            *k2 == format!("LaunchTemplateConfigs.{c}.LaunchTemplateSpecification.LaunchTemplateName")
                        })
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default();
                    out.push(Override {
                        config: c,
                        index: i,
                        instance_type: String::new(),
                        zone: String::new(),
                        subnet: String::new(),
                        template,
                    });
                    out.len() - 1
                }
            };
            match parts[4] {
                "InstanceType" => out[pos].instance_type = v.clone(),
                "AvailabilityZone" => out[pos].zone = v.clone(),
                "SubnetId" => out[pos].subnet = v.clone(),
                _ => {}
            }
        }
    }
    out
}

/// EC2's CreateFleet answer when no override had capacity.
fn fleet_errors(os: &[Override], lifecycle: &str) -> String {
    let mut items = String::new();
    for o in os {
        items.push_str(&format!(
            "<item><launchTemplateAndOverrides><launchTemplateSpecification><launchTemplateName>{}</launchTemplateName><version>$Latest</version></launchTemplateSpecification><overrides><instanceType>{}</instanceType><subnetId>{}</subnetId><availabilityZone>{}</availabilityZone></overrides></launchTemplateAndOverrides><lifecycle>{lifecycle}</lifecycle><errorCode>InsufficientInstanceCapacity</errorCode><errorMessage>We currently do not have sufficient {} capacity in the Availability Zone you requested ({}).</errorMessage></item>",
            o.template, o.instance_type, o.subnet, o.zone, o.instance_type, o.zone
        ));
    }
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<CreateFleetResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>00000000-0000-0000-0000-000000000001</requestId><fleetId>fleet-00000000-0000-0000-0000-000000000001</fleetId><errorSet>{items}</errorSet><fleetInstanceSet/></CreateFleetResponse>"
    )
}

/// What the proxy decided for one request.
enum Verdict {
    Answer(Vec<u8>),
    Forward(Vec<u8>),
    /// Forward, but answer the client with a server error instead of moto's answer.
    ForwardAndLose(Vec<u8>),
}

const INTERNAL_ERROR: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>InternalError</Code><Message>An internal error has occurred.</Message></Error></Errors><RequestID>00000000-0000-0000-0000-000000000002</RequestID></Response>";

fn decide(body: Vec<u8>, target: Option<&str>, faults: &Mutex<Faults>) -> Verdict {
    let mut f = faults.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let fields = if target.is_none() { form(&body) } else { Vec::new() };
    let action = match target {
        Some(t) => t.rsplit('.').next().unwrap_or(t).to_string(),
        None => fields.iter().find(|(k, _)| k == "Action").map(|(_, v)| v.clone()).unwrap_or_default(),
    };
    let service = match target {
        Some(t) if t.starts_with("AmazonSQS") => "sqs",
        Some(t) if t.starts_with("AmazonSSM") => "ssm",
        Some(_) => "unknown",
        None => "ec2",
    };
    f.actions.push(format!("{service}:{action}"));
    let ec2 = target.is_none();
    if ec2 && f.throttle_next > 0 {
        f.throttle_next -= 1;
        return Verdict::Answer(response("503 Service Unavailable", THROTTLED));
    }
    // EC2's limits that moto does not keep: at most 200 filter values a call, and a
    // termination refused whole when it names a protected instance.
    if ec2 && fields.iter().filter(|(k, _)| k.starts_with("Filter.") && k.contains(".Value.")).count() > 200 {
        return Verdict::Answer(response(
            "400 Bad Request",
            &ec2_error("FilterLimitExceeded", "more than 200 filter values"),
        ));
    }
    if action == "TerminateInstances"
        && fields.iter().any(|(k, v)| k.starts_with("InstanceId.") && f.protected.contains(v))
    {
        let message = "the instance may not be terminated: modify its disableApiTermination attribute";
        return Verdict::Answer(response("400 Bad Request", &ec2_error("OperationNotPermitted", message)));
    }
    if action == "DescribeSpotPriceHistory"
        && let Some(prices) = &f.spot_prices
    {
        return Verdict::Answer(response("200 OK", &spot_history(prices)));
    }
    if action == "CreateFleet" && f.lose_fleet_response > 0 {
        f.lose_fleet_response -= 1;
        return Verdict::ForwardAndLose(body);
    }
    if action != "CreateFleet" || f.exhausted.is_empty() {
        return Verdict::Forward(body);
    }
    let lifecycle = fields
        .iter()
        .find(|(k, _)| k == "TargetCapacitySpecification.DefaultTargetCapacityType")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| "on-demand".into());
    let os = overrides(&fields);
    let (dead, live): (Vec<&Override>, Vec<&Override>) =
        os.iter().partition(|o| f.exhausted.contains(&(o.instance_type.clone(), o.zone.clone(), lifecycle.clone())));
    if dead.is_empty() {
        return Verdict::Forward(body);
    }
    if live.is_empty() {
        return Verdict::Answer(response("200 OK", &fleet_errors(&os, &lifecycle)));
    }
    // Drop the exhausted overrides and renumber the rest.
    let dead_keys: HashSet<(String, String)> = dead.iter().map(|o| (o.config.clone(), o.index.clone())).collect();
    let mut next: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut renumber: std::collections::HashMap<(String, String), usize> = std::collections::HashMap::new();
    for o in &live {
        let n = next.entry(o.config.clone()).or_insert(0);
        *n += 1;
        renumber.insert((o.config.clone(), o.index.clone()), *n);
    }
    let mut out = Vec::new();
    for (k, v) in &fields {
        let parts: Vec<&str> = k.split('.').collect();
        if parts.len() == 5 && parts[0] == "LaunchTemplateConfigs" && parts[2] == "Overrides" {
            let key = (parts[1].to_string(), parts[3].to_string());
            if dead_keys.contains(&key) {
                continue;
            }
            let n = renumber.get(&key).copied().unwrap_or(0);
            out.push(format!(
                "{}={}",
                encode(&format!("LaunchTemplateConfigs.{}.Overrides.{n}.{}", parts[1], parts[4])),
                encode(v)
            ));
        } else {
            out.push(format!("{}={}", encode(k), encode(v)));
        }
    }
    Verdict::Forward(out.join("&").into_bytes())
}

async fn handle(client: TcpStream, upstream: SocketAddr, faults: Arc<Mutex<Faults>>) -> std::io::Result<()> {
    let (rd, mut wr) = client.into_split();
    let mut rd = BufReader::new(rd);
    let mut head: Vec<String> = Vec::new();
    for _line in 0..=256 {
        let mut line = String::new();
        if rd.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            break;
        }
        head.push(line);
    }
    if head.is_empty() || head.len() > 256 {
        return Ok(());
    }
    let header = |name: &str| {
        head.iter().skip(1).find_map(|h| {
            let (k, v) = h.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_string())
        })
    };
    let len: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let target = header("x-amz-target");
    let mut body = vec![0u8; len];
    rd.read_exact(&mut body).await?;
    let (forward, lose) = match decide(body, target.as_deref(), &faults) {
        Verdict::Answer(bytes) => {
            wr.write_all(&bytes).await?;
            return Ok(());
        }
        Verdict::Forward(b) => (b, false),
        Verdict::ForwardAndLose(b) => (b, true),
    };
    let mut up = TcpStream::connect(upstream).await?;
    let mut req = String::new();
    req.push_str(&head[0]);
    req.push_str("\r\n");
    for h in head.iter().skip(1) {
        let name = h.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if name == "content-length" || name == "connection" {
            continue;
        }
        req.push_str(h);
        req.push_str("\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", forward.len()));
    up.write_all(req.as_bytes()).await?;
    up.write_all(&forward).await?;
    let mut answer = Vec::new();
    up.read_to_end(&mut answer).await?;
    if lose {
        wr.write_all(&response("500 Internal Server Error", INTERNAL_ERROR)).await?;
        return Ok(());
    }
    // Tell the client the connection ends here.
    wr.write_all(&close_after(answer)).await?;
    Ok(())
}

/// The response with `Connection: close` (the proxy serves one request per connection).
fn close_after(answer: Vec<u8>) -> Vec<u8> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else { return answer };
    let head = String::from_utf8_lossy(&answer[..end]).into_owned();
    let mut out = String::new();
    for line in head.split("\r\n") {
        if line.split(':').next().is_some_and(|n| n.trim().eq_ignore_ascii_case("connection")) {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&answer[end + 4..]);
    bytes
}
