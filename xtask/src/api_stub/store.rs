//! One resource's objects, kept by key (namespace, name) as etcd keeps
//! them under `/registry/<resource>/<namespace>/<name>`: a list comes out
//! in key order, a page resumes after a key, and replacing one object
//! among ten thousand costs a lookup, not a scan. An object is shared
//! (`Arc`) with the history watches replay and the lists that send it,
//! not copied for each.

use std::{collections::BTreeMap, sync::Arc};

use serde_json::Value;

use super::namespace_of;

/// Where an object sits: its namespace (`default` when it names none,
/// as for cluster-scoped objects) and its name.
pub(crate) type Key = (String, String);

#[derive(Default)]
pub(crate) struct Objects(BTreeMap<Key, Arc<Value>>);

impl Objects {
    pub fn key_of(object: &Value) -> Key {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        (namespace_of(object).to_string(), name.to_string())
    }

    /// Adds `object`, or replaces the one of the same key.
    pub fn put(&mut self, object: Arc<Value>) {
        self.0.insert(Self::key_of(&object), object);
    }

    pub fn remove(&mut self, key: &Key) {
        self.0.remove(key);
    }

    pub fn get(&self, namespace: &str, name: &str) -> Option<&Value> {
        let object = self.0.get(&(namespace.to_string(), name.to_string()))?;
        Some(object)
    }

    /// Every object, in key order.
    pub fn values(&self) -> impl Iterator<Item = &Value> {
        self.0.values().map(|object| &**object)
    }

    /// The objects whose key is past `key` (all of them when `None`), in
    /// key order, with their keys.
    pub fn after<'a>(
        &'a self,
        key: Option<&Key>,
    ) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> {
        use std::ops::Bound::{Excluded, Unbounded};
        let start = key.map_or(Unbounded, Excluded);
        self.0.range((start, Unbounded))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(namespace: &str, name: &str) -> Value {
        json!({"metadata": {"namespace": namespace, "name": name}})
    }

    #[test]
    fn objects_come_out_in_key_order_and_a_put_replaces_its_key() {
        let mut objects = Objects::default();
        for (ns, name) in [
            ("kube-system", "a"),
            ("default", "web-1"),
            ("default", "db-0"),
        ] {
            objects.put(Arc::new(object(ns, name)));
        }
        let mut again = object("default", "web-1");
        again["spec"] = json!({"nodeName": "node-2"});
        objects.put(Arc::new(again));
        let keys: Vec<String> = objects
            .values()
            .map(|o| format!("{}/{}", namespace_of(o), o["metadata"]["name"]))
            .collect();
        assert_eq!(
            keys,
            ["default/\"db-0\"", "default/\"web-1\"", "kube-system/\"a\""]
        );
        assert_eq!(objects.len(), 3);
        assert_eq!(
            objects.get("default", "web-1").unwrap()["spec"]["nodeName"],
            "node-2"
        );
        let start = Objects::key_of(&object("default", "web-1"));
        let rest: Vec<&Key> = objects.after(Some(&start)).map(|(k, _)| k).collect();
        assert_eq!(rest, [&("kube-system".to_string(), "a".to_string())]);
    }
}
