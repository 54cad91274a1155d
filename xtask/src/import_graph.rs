//! A folder's imports as a graph of its files, and the cycles in it.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Unit → unit it imports → the line of its first such import.
pub(crate) type Graph = BTreeMap<String, BTreeMap<String, usize>>;

/// The strongly connected components of more than one unit (Tarjan).
pub(crate) fn strongly_connected(graph: &Graph) -> Vec<Vec<String>> {
    struct State<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            if !s.index.contains_key(w.as_str()) {
                visit(s, w);
                s.low.insert(v, s.low[v].min(s.low[w.as_str()]));
            } else if s.stack.contains(&w.as_str()) {
                s.low.insert(v, s.low[v].min(s.index[w.as_str()]));
            }
        }
        if s.low[v] == s.index[v] {
            let at = s.stack.iter().rposition(|x| *x == v).unwrap_or(0);
            let component: Vec<String> = s.stack.drain(at..).map(str::to_string).collect();
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !state.index.contains_key(v.as_str()) {
            visit(&mut state, v);
        }
    }
    state.found
}

/// A shortest cycle through the component's first unit, each step with
/// the line of its import.
pub(crate) fn one_cycle(graph: &Graph, component: &[String]) -> Vec<(String, usize)> {
    let start = component.iter().min().cloned().unwrap_or_default();
    let inside: BTreeSet<&String> = component.iter().collect();
    // Breadth first from `start` back to it, inside the component.
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([start.clone()]);
    while let Some(v) = queue.pop_front() {
        for w in graph.get(&v).into_iter().flat_map(|e| e.keys()) {
            if !inside.contains(w) || came_from.contains_key(w) {
                continue;
            }
            came_from.insert(w.clone(), v.clone());
            if *w == start {
                queue.clear();
                break;
            }
            queue.push_back(w.clone());
        }
    }
    let mut order = vec![start.clone()];
    let mut at = came_from.get(&start).cloned();
    while let Some(v) = at.filter(|v| *v != start) {
        at = came_from.get(&v).cloned();
        order.push(v);
    }
    order.reverse();
    // `order` is start's predecessors back to start; rotate so start is first.
    order.rotate_right(1);
    (0..order.len())
        .map(|i| {
            let next = &order[(i + 1) % order.len()];
            (order[i].clone(), graph[&order[i]][next])
        })
        .collect()
}
