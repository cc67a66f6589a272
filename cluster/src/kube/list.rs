//! Lists from the API server's watch cache, read as they arrive, then a watch from the list's
//! resource version: how a kind is followed on a server that does not stream lists.
//!
//! A list with `resourceVersion=0` is served from the watch cache (no quorum read of etcd),
//! but the cache does not paginate it: 300,000 pods come as one answer. Read whole, that answer
//! would be held twice (its JSON and the typed objects) before one pod was cached; kube's own
//! list reads it whole. Here the answer's body is parsed as it streams in, each object
//! converted (and shared) the moment it is read, so the list never holds more than one API
//! object at a time. The watch then starts from the list's resource version, as a
//! reflector's does; a 410 (that version compacted away) lists again.

use std::io::Read;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use http_body_util::BodyExt;
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::store::{Cached, Listing, Shared, apply, delete, watch_error};

/// The waits between failed attempts: 1 s doubling to 30 s, back to 1 s after a success.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_secs(1);
    const MOST: Duration = Duration::from_secs(30);

    fn new() -> Self {
        Backoff(Self::FIRST)
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Self::MOST);
    }

    fn reset(&mut self) {
        self.0 = Self::FIRST;
    }
}

/// Why a list failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum ListError {
    #[error("listing: {0}")]
    Request(#[from] kube::Error),
    #[error("listing: HTTP {status}: {body}")]
    Status { status: http::StatusCode, body: String },
    #[error("reading the list: {0}")]
    Parse(String),
}

/// Follows a kind until the process ends: a list from the watch cache, then a watch from its
/// resource version; errors are counted and retried with backoff, a 410 lists again.
pub(super) async fn follow_listed<K: Cached>(api: Api<K>, shared: Arc<Shared>) {
    let client = api.clone().into_client();
    let url = api.resource_url().to_string();
    let mut backoff = Backoff::new();
    // The newest version seen: a relist asks for a state no older than it (the watch cache
    // waits to catch up rather than answer with the past), the first list for any state.
    let mut since: Option<String> = None;
    loop {
        let version = match list::<K>(&client, &url, since.as_deref(), shared.clone()).await {
            Ok(v) => {
                backoff.reset();
                v
            }
            Err(e) => {
                watch_error::<K>(&shared);
                tracing::warn!(kind = K::KIND, error = %e, "list of {} failed; retrying with backoff", K::KIND);
                // A version the server cannot serve (too large for a lagging cache, or
                // malformed) is not asked for again: the next list takes any state.
                since = None;
                backoff.wait().await;
                continue;
            }
        };
        since = Some(watch_from(&api, &shared, version, &mut backoff).await);
    }
}

/// Watches from `version` until a list is needed again (the version is gone: 410); the
/// newest version it saw.
async fn watch_from<K: Cached>(api: &Api<K>, shared: &Shared, mut version: String, backoff: &mut Backoff) -> String {
    loop {
        // Bookmarks are asked for (kube's default): they keep a quiet kind's version fresh,
        // so a watch restarted after the server's timeout does not find it gone (410).
        let params = WatchParams::default().timeout(290);
        let events = match api.watch(&params, &version).await {
            Ok(events) => events,
            Err(kube::Error::Api(s)) if s.code == 410 => return version,
            Err(e) => {
                watch_error::<K>(shared);
                tracing::warn!(kind = K::KIND, error = %e, "watch of {} failed to start; retrying with backoff", K::KIND);
                backoff.wait().await;
                continue;
            }
        };
        futures::pin_mut!(events);
        loop {
            match events.try_next().await {
                Ok(Some(WatchEvent::Added(obj) | WatchEvent::Modified(obj))) => {
                    version = obj.meta().resource_version.clone().unwrap_or(version);
                    apply(shared, obj);
                }
                Ok(Some(WatchEvent::Deleted(obj))) => {
                    version = obj.meta().resource_version.clone().unwrap_or(version);
                    delete(shared, &obj);
                }
                Ok(Some(WatchEvent::Bookmark(b))) => version = b.metadata.resource_version,
                Ok(Some(WatchEvent::Error(status))) if status.code == 410 => return version,
                Ok(Some(WatchEvent::Error(status))) => {
                    watch_error::<K>(shared);
                    tracing::warn!(kind = K::KIND, error = %status.message, "watch of {} answered an error; watching again", K::KIND);
                    backoff.wait().await;
                    break;
                }
                // The server ended the watch (its timeout): watched again from where it was.
                Ok(None) => {
                    backoff.reset();
                    break;
                }
                Err(e) => {
                    watch_error::<K>(shared);
                    tracing::warn!(kind = K::KIND, error = %e, "watch of {} broke; watching again", K::KIND);
                    backoff.wait().await;
                    break;
                }
            }
        }
    }
}

/// Lists every object at `url` from the watch cache (a state no older than `since`, any
/// state without it) and swaps them into the cache whole; the list's resource version. The
/// answer's body is parsed on the blocking pool as it arrives, each object converted there as
/// it is read.
async fn list<K: Cached>(
    client: &kube::Client,
    url: &str,
    since: Option<&str>,
    shared: Arc<Shared>,
) -> Result<String, ListError> {
    // Resource versions are opaque; one that would need escaping in a query is not asked for.
    let version = since.filter(|v| v.bytes().all(|b| b.is_ascii_alphanumeric())).unwrap_or("0");
    let uri = format!("{url}?resourceVersion={version}&resourceVersionMatch=NotOlderThan");
    let request = http::Request::get(uri)
        .body(kube::client::Body::empty())
        .map_err(|e| ListError::Parse(format!("building the request: {e}")))?;
    let response = client.send(request).await?;
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let bytes = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes[..bytes.len().min(2_000)]).into_owned();
        return Err(ListError::Status { status, body: text });
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    let parse = tokio::task::spawn_blocking(move || {
        let mut listing = Listing::<K>::new();
        let reader = Chunks { rx, at: Bytes::new() };
        let version = read_list::<K>(reader, |obj| listing.add(&shared, obj))?;
        listing.finish(&shared);
        Ok::<String, ListError>(version)
    });
    // The body's frames, handed to the parser as they come; a parser that stopped (a
    // malformed answer) ends the pumping.
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                if tx.send(Err(std::io::Error::other(e.to_string()))).await.is_err() {
                    tracing::debug!(kind = K::KIND, "the list's parser stopped first");
                }
                break;
            }
        };
        if let Ok(data) = frame.into_data()
            && tx.send(Ok(data)).await.is_err()
        {
            break;
        }
    }
    drop(tx);
    parse.await.map_err(|e| ListError::Parse(format!("the parser failed: {e}")))?
}

/// A blocking reader over the body's chunks.
struct Chunks {
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    at: Bytes,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.at = b,
                Some(Err(e)) => return Err(e),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.at.len());
        buf[..n].copy_from_slice(&self.at[..n]);
        self.at = self.at.slice(n..);
        Ok(n)
    }
}

/// Reads a list (`{"metadata": {"resourceVersion": ...}, "items": [...]}`), handing each
/// item to `each` as it is read; the list's resource version.
pub(super) fn read_list<K: serde::de::DeserializeOwned>(
    reader: impl Read,
    each: impl FnMut(K),
) -> Result<String, ListError> {
    let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(64 << 10, reader));
    let version =
        de.deserialize_map(ListVisitor { each, _k: PhantomData::<K> }).map_err(|e| ListError::Parse(e.to_string()))?;
    de.end().map_err(|e| ListError::Parse(e.to_string()))?;
    Ok(version)
}

struct ListVisitor<K, F> {
    each: F,
    _k: PhantomData<K>,
}

/// The list's metadata: only its resource version is read.
#[derive(serde::Deserialize)]
struct ListMeta {
    #[serde(rename = "resourceVersion", default)]
    resource_version: Option<String>,
}

impl<'de, K: serde::Deserialize<'de>, F: FnMut(K)> Visitor<'de> for ListVisitor<K, F> {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Kubernetes list")
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<String, A::Error> {
        let mut version = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "metadata" => version = map.next_value::<ListMeta>()?.resource_version,
                "items" => map.next_value_seed(Items { each: &mut self.each, _k: PhantomData::<K> })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        version.ok_or_else(|| serde::de::Error::custom("the list has no metadata.resourceVersion"))
    }
}

struct Items<'a, K, F> {
    each: &'a mut F,
    _k: PhantomData<K>,
}

impl<'de, K: serde::Deserialize<'de>, F: FnMut(K)> DeserializeSeed<'de> for Items<'_, K, F> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, K: serde::Deserialize<'de>, F: FnMut(K)> Visitor<'de> for Items<'_, K, F> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("the list's items")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<K>()? {
            (self.each)(item);
        }
        Ok(())
    }

    /// `"items": null` (an empty list, as some servers write it).
    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespaces(version: &str, names: &[&str]) -> String {
        let items: Vec<String> =
            names.iter().map(|n| format!(r#"{{"metadata":{{"name":"{n}","resourceVersion":"{version}"}}}}"#)).collect();
        format!(
            r#"{{"kind":"NamespaceList","apiVersion":"v1","metadata":{{"resourceVersion":"{version}"}},"items":[{}]}}"#,
            items.join(",")
        )
    }

    /// A watch whose version was compacted away (410) lists again, asking the cache for a
    /// state no older than the newest version the watch saw (never an older one), and the
    /// relist replaces the cache whole: an object deleted meanwhile goes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn after_a_410_the_list_asks_for_no_older_than_the_watch_saw_and_replaces_the_cache() {
        let added = r#"{"type":"ADDED","object":{"kind":"Namespace","apiVersion":"v1","metadata":{"name":"b","resourceVersion":"11"}}}"#;
        let gone = r#"{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old resource version: 10 (20)","reason":"Expired","code":410}}"#;
        let (url, seen) = super::super::test_server::serve(vec![
            (200, namespaces("10", &["a"])),
            (200, format!("{added}\n{gone}\n")),
            (200, namespaces("20", &["b"])),
        ]);
        let config = kube::Config::new(url.parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let shared = Arc::new(Shared::new());
        let task =
            tokio::spawn(follow_listed::<k8s_openapi::api::core::v1::Namespace>(Api::all(client), shared.clone()));
        let names = || shared.lock().snap.namespaces.keys().cloned().collect::<Vec<_>>();
        let mut relisted = false;
        for _ in 0..200 {
            if seen.lock().expect("log").len() >= 3 && names() == ["b"] {
                relisted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        task.abort();
        let seen: Vec<String> = seen.lock().expect("log").iter().map(|(line, _)| line.clone()).collect();
        assert!(relisted, "relisted: {:?}, requests {seen:?}", names());
        assert!(seen[0].contains("resourceVersion=0&resourceVersionMatch=NotOlderThan"), "{seen:?}");
        assert!(seen[1].contains("watch=true") && seen[1].contains("resourceVersion=10"), "{seen:?}");
        assert!(seen[2].contains("resourceVersion=11&resourceVersionMatch=NotOlderThan"), "{seen:?}");
        assert!(shared.lock().synced.contains("Namespace"));
    }

    /// A reader that hands out its text a few bytes at a time, as a body's frames come.
    struct Dribble<'a>(&'a [u8]);

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.0.len()).min(7);
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_list_is_read_item_by_item_as_it_arrives_with_its_resource_version() {
        let text = br#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"4711","continue":""},
            "items":[{"metadata":{"name":"a","namespace":"shop"},"spec":{"containers":[{"name":"c"}]}},
                     {"metadata":{"name":"b","namespace":"shop"},"spec":{"containers":[{"name":"c"}]},"status":{"phase":"Running"}}]}"#;
        let mut names = Vec::new();
        let version = read_list::<k8s_openapi::api::core::v1::Pod>(Dribble(text), |p| {
            names.push(p.metadata.name.unwrap_or_default());
        })
        .expect("a list");
        assert_eq!((version.as_str(), names), ("4711", vec!["a".to_string(), "b".to_string()]));
        // Items before the metadata, and none at all.
        let late = br#"{"items":null,"metadata":{"resourceVersion":"9"}}"#;
        let mut n = 0;
        assert_eq!(read_list::<k8s_openapi::api::core::v1::Pod>(Dribble(late), |_| n += 1).expect("a list"), "9");
        assert_eq!(n, 0);
        // A list cut off mid-item is an error, not a shorter list.
        let cut = &text[..text.len() - 40];
        assert!(matches!(read_list::<k8s_openapi::api::core::v1::Pod>(Dribble(cut), |_| {}), Err(ListError::Parse(_))));
        // No resource version: nothing to watch from.
        let bare = br#"{"items":[]}"#;
        assert!(matches!(
            read_list::<k8s_openapi::api::core::v1::Pod>(Dribble(bare), |_| {}),
            Err(ListError::Parse(_))
        ));
    }
}
