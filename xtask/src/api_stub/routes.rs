//! The stub's REST routes: which object a path names, the verbs on it,
//! and their answers in the API's wire format.

use std::{collections::HashMap, convert::Infallible, fmt::Write, time::Duration};

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::{body::Frame, Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::{discovery, fields, paging, request_log::ApiRequest, tables, Shared, State, TOKEN};

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// What a path names.
pub(crate) struct Target<'a> {
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: Option<&'a str>,
    pub subresource: Option<&'a str>,
}

/// Splits `/api/v1/…` and `/apis/<group>/<version>/…` paths.
fn target<'a>(parts: &[&'a str]) -> Option<Target<'a>> {
    let rest = match parts {
        ["api", "v1", rest @ ..] => rest,
        ["apis", _, _, rest @ ..] => rest,
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        rest => (None, rest),
    };
    match rest {
        [resource] => Some(Target {
            resource,
            namespace,
            name: None,
            subresource: None,
        }),
        [resource, name] => Some(Target {
            resource,
            namespace,
            name: Some(name),
            subresource: None,
        }),
        [resource, name, sub] => Some(Target {
            resource,
            namespace,
            name: Some(name),
            subresource: Some(sub),
        }),
        _ => None,
    }
}

pub(crate) async fn handle(req: Request<hyper::body::Incoming>, shared: &Shared) -> Response<Body> {
    let (head, body) = req.into_parts();
    let path = head.uri.path().trim_matches('/').to_string();
    let parts: Vec<&str> = path.split('/').collect();
    let q = query(head.uri.query().unwrap_or(""));
    let t = target(&parts);
    let verb = verb_of(&head.method, t.as_ref(), &q);
    let request = ApiRequest::new(&head, t.as_ref(), verb, &q);
    let authorized = head
        .headers
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .is_some_and(|h| h == format!("Bearer {TOKEN}"));
    let response = if authorized {
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        answer(shared, &head, &body, (&parts, t), verb, &q).await
    } else {
        status(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "Unauthorized".into(),
            json!({}),
        )
    };
    shared.requests.answered(request, response)
}

/// The verb, as RBAC names it, of a request to `t` (get for a path that
/// names no resource).
fn verb_of(method: &Method, t: Option<&Target>, q: &HashMap<String, String>) -> &'static str {
    let watch = matches!(q.get("watch").map(String::as_str), Some("1" | "true"));
    match (method, t.map(|t| t.name), watch) {
        (&Method::POST, _, _) => "create",
        (&Method::DELETE, _, _) => "delete",
        (&Method::PATCH, _, _) => "patch",
        (&Method::PUT, _, _) => "update",
        (_, None | Some(Some(_)), _) => "get",
        (_, Some(None), true) => "watch",
        (_, Some(None), false) => "list",
    }
}

async fn answer(
    shared: &Shared,
    head: &hyper::http::request::Parts,
    body: &[u8],
    (parts, t): (&[&str], Option<Target<'_>>),
    verb: &str,
    q: &HashMap<String, String>,
) -> Response<Body> {
    let accept = head
        .headers
        .get("accept")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    if let Some(answer) = discovery::answer(parts, accept) {
        return answer;
    }
    let Some(t) = t else {
        return not_found(
            "the server could not find the requested resource".into(),
            json!({}),
        );
    };
    let resource_name = match t.subresource {
        Some(sub) => format!("{}/{sub}", t.resource),
        None => t.resource.to_string(),
    };
    if let Some(denied) = forbidden(shared, verb, &resource_name, t.namespace) {
        return denied;
    }
    match verb {
        "create" => create(shared, &t, body).await,
        "delete" => delete(shared, &t),
        "patch" | "update" => modify(shared, &t, body, verb == "patch"),
        "get" if t.subresource == Some("log") => log(shared, &t, q),
        "get" => get(shared, &t),
        "list" => list(shared, &t, q, accept),
        _ => super::watches::watch(shared, &t, q),
    }
}

fn forbidden(
    shared: &Shared,
    verb: &str,
    resource: &str,
    namespace: Option<&str>,
) -> Option<Response<Body>> {
    let st = shared.state.lock().unwrap();
    if !st
        .forbidden
        .contains(&(verb.to_string(), resource.to_string()))
    {
        return None;
    }
    let scope = namespace.map_or("at the cluster scope".to_string(), |ns| {
        format!("in the namespace \"{ns}\"")
    });
    // The group as RBAC names it: "" for the core one.
    let group = discovery::group_version(resource)
        .rsplit_once('/')
        .map_or("", |(g, _)| g);
    Some(status(
        StatusCode::FORBIDDEN,
        "Forbidden",
        format!("{resource} is forbidden: User \"system:serviceaccount:podtrace:podtrace\" cannot {verb} resource \"{resource}\" in API group \"{group}\" {scope}"),
        json!({"kind": resource}),
    ))
}

fn find(shared: &Shared, t: &Target) -> Option<Value> {
    let st = shared.state.lock().unwrap();
    let objects = st.objects.get(t.resource)?;
    let name = t.name.unwrap_or_default();
    match t.namespace {
        Some(ns) => objects.get(ns, name).cloned(),
        // Cluster-scoped: few, and keyed by whatever namespace they lack.
        None => objects
            .values()
            .find(|o| o["metadata"]["name"] == name)
            .cloned(),
    }
}

fn missing(t: &Target) -> Response<Body> {
    let name = t.name.unwrap_or_default();
    not_found(
        format!("{} \"{name}\" not found", t.resource),
        json!({"name": name, "kind": t.resource}),
    )
}

fn get(shared: &Shared, t: &Target) -> Response<Body> {
    match find(shared, t) {
        Some(o) => json_response(StatusCode::OK, &o),
        None => missing(t),
    }
}

async fn create(shared: &Shared, t: &Target<'_>, body: &[u8]) -> Response<Body> {
    let Ok(mut object) = serde_json::from_slice::<Value>(body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is not JSON".into(),
            json!({}),
        );
    };
    if let Some(ns) = t.namespace {
        object["metadata"]["namespace"] = ns.into();
    }
    if let (Some(ns), "pods") = (t.namespace, t.resource) {
        if let Some(refused) = super::admission::refuse_pod(shared, ns, &object) {
            return refused;
        }
    }
    let probe = Target {
        name: object["metadata"]["name"].as_str(),
        ..*t
    };
    if find(shared, &probe).is_some() {
        let name = probe.name.unwrap_or_default();
        return status(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", t.resource),
            json!({"name": name}),
        );
    }
    object["metadata"]["creationTimestamp"] = super::kubelet::now().into();
    if t.resource == "pods" {
        object["status"] = json!({"phase": "Pending"});
    }
    let created = shared.change(t.resource, "ADDED", object);
    if t.resource == "pods" {
        if let Some(kubelet) = &shared.kubelet {
            kubelet.run(shared, &created);
        }
    }
    json_response(StatusCode::CREATED, &created)
}

fn delete(shared: &Shared, t: &Target) -> Response<Body> {
    let Some(object) = find(shared, t) else {
        return missing(t);
    };
    if t.resource == "pods" {
        if let Some(kubelet) = &shared.kubelet {
            if let Some(terminating) = kubelet.stop(shared, &object) {
                return json_response(StatusCode::OK, &terminating);
            }
        }
    }
    let gone = shared.change(t.resource, "DELETED", object);
    json_response(StatusCode::OK, &gone)
}

fn modify(shared: &Shared, t: &Target, body: &[u8], merge: bool) -> Response<Body> {
    let Some(mut object) = find(shared, t) else {
        return missing(t);
    };
    let Ok(change) = serde_json::from_slice::<Value>(body) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the body is not JSON".into(),
            json!({}),
        );
    };
    if merge {
        merge_patch(&mut object, &change);
    } else {
        object = change;
    }
    json_response(
        StatusCode::OK,
        &shared.change(t.resource, "MODIFIED", object),
    )
}

/// RFC 7386 JSON merge patch.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(fields) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    for (key, value) in fields {
        if value.is_null() {
            target.as_object_mut().unwrap().remove(key);
        } else {
            merge_patch(&mut target[key], value);
        }
    }
}

fn log(shared: &Shared, t: &Target, q: &HashMap<String, String>) -> Response<Body> {
    let Some(pod) = find(shared, t) else {
        return missing(t);
    };
    let Some(buffer) = shared.kubelet.as_ref().and_then(|k| k.log(&pod)) else {
        let name = t.name.unwrap_or_default();
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("container \"agent\" in pod \"{name}\" is waiting to start: ContainerCreating"),
            json!({}),
        );
    };
    let follow = q.get("follow").is_some_and(|v| v == "true" || v == "1");
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
    tokio::spawn(async move {
        let mut sent = 0;
        loop {
            let (chunk, done) = {
                let log = buffer.lock().unwrap();
                (log.data[sent..].to_vec(), log.done)
            };
            sent += chunk.len();
            if !chunk.is_empty() && tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
                return;
            }
            if done || !follow {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "text/plain")
        .body(BodyExt::boxed(StreamBody::new(stream_of(rx))))
        .unwrap()
}

fn list(shared: &Shared, t: &Target, q: &HashMap<String, String>, accept: &str) -> Response<Body> {
    let st = shared.state.lock().unwrap();
    if let Some(refused) = refused_fields(&st, t, q) {
        return refused;
    }
    let page = match paging::page(&st, t.resource, t.namespace, q) {
        Ok(page) => page,
        Err((code, reason, message)) => return status(code, reason, message, json!({})),
    };
    drop(st);
    if accept.contains("as=Table") {
        return json_response(
            StatusCode::OK,
            &tables::table(t.resource, &page.items, page.metadata),
        );
    }
    // Written item by item from the store: a list of ten thousand pods
    // is not copied first.
    let kind = discovery::list_kind(t.resource);
    let api_version = discovery::group_version(t.resource);
    let mut text = format!(
        "{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{},\"items\":[",
        page.metadata
    );
    for (i, item) in page.items.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let _ = write!(text, "{comma}{item}");
    }
    text.push_str("]}");
    json_text(StatusCode::OK, text)
}

/// The 400 for a field selector the resource does not take.
pub(crate) fn refused_fields(
    st: &State,
    t: &Target,
    q: &HashMap<String, String>,
) -> Option<Response<Body>> {
    let selector = q.get("fieldSelector")?;
    let message = fields::refusal(t.resource, selector, &st.refused_fields)?;
    Some(status(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        message,
        json!({}),
    ))
}

pub(crate) fn status(
    code: StatusCode,
    reason: &str,
    message: String,
    details: Value,
) -> Response<Body> {
    json_response(
        code,
        &json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "details": details, "code": code.as_u16()
        }),
    )
}

fn not_found(message: String, details: Value) -> Response<Body> {
    status(StatusCode::NOT_FOUND, "NotFound", message, details)
}

pub(crate) fn json_response(code: StatusCode, body: &Value) -> Response<Body> {
    json_text(code, body.to_string())
}

fn json_text(code: StatusCode, text: String) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)).boxed())
        .unwrap()
}

fn query(text: &str) -> HashMap<String, String> {
    form_urlencoded::parse(text.as_bytes())
        .into_owned()
        .collect()
}

/// An mpsc receiver as a Stream of body frames.
pub(crate) fn stream_of(
    mut rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, Infallible>>,
) -> impl futures::Stream<Item = Result<Frame<Bytes>, Infallible>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_form_decoded() {
        let q = query("labelSelector=app+in+%28a%2Cb%29&watch=1");
        assert_eq!(q["labelSelector"], "app in (a,b)");
        assert_eq!(q["watch"], "1");
    }
}
