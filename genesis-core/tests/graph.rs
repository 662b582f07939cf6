//! Graph capture and replay on the CPU backend (which records its ops): replays compute on
//! the current contents of the captured inputs, host access inside a capture is an error
//! that leaves the device usable, and the buffers a graph touches are never handed to other
//! tensors while it lives.

use genesis::graph::Graph;
use genesis::{no_grad, DType, Device, Tensor};

fn cpu() -> Device {
    Device::cpu().unwrap()
}

#[test]
fn nothing_runs_while_capturing_and_each_replay_reads_the_inputs_anew() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], &cpu()).unwrap();
    let (graph, y) = no_grad(|| Graph::capture(&cpu(), || x.mul_scalar(10.0)?.add_scalar(1.0))).unwrap();
    x.copy_(&Tensor::from_vec(vec![4.0f32, 5.0, 6.0], &[3], &cpu()).unwrap()).unwrap();
    graph.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [41.0, 51.0, 61.0]);
    x.fill_(0.5).unwrap();
    graph.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [6.0, 6.0, 6.0]);
    // The input the capture saw was [1, 2, 3], but nothing ran then: y held no result of it.
    assert!(graph.buffer_count() >= 3, "x, the temporary and y: {graph:?}");
}

#[test]
fn host_access_inside_a_capture_is_an_error_and_ends_the_capture() {
    let x = Tensor::ones(&[4], DType::F32, &cpu()).unwrap();
    let err = no_grad(|| Graph::capture(&cpu(), || x.add_scalar(1.0)?.sum()?.item::<f32>())).unwrap_err();
    assert!(err.to_string().contains("capturing a graph"), "{err}");
    let err = Graph::capture(&cpu(), || Tensor::from_vec(vec![1.0f32], &[1], &cpu())).unwrap_err();
    assert!(err.to_string().contains("capturing a graph"), "{err}");
    // The device runs work normally again, and a new capture can begin.
    assert_eq!(x.add_scalar(1.0).unwrap().to_vec::<f32>().unwrap(), [2.0; 4]);
    assert!(Graph::supported(&cpu()));
    // A capture inside a capture is refused.
    let err = Graph::capture(&cpu(), || Graph::capture(&cpu(), || Ok(())).map(|_| ())).unwrap_err();
    assert!(err.to_string().contains("already capturing"), "{err}");
}

#[test]
fn buffers_of_the_graph_are_not_reused_while_it_lives() {
    let n = 1024;
    let x = Tensor::full(&[n], 1.0, DType::F32, &cpu()).unwrap();
    // The temporary `t` is dropped inside the closure; its buffer must stay the graph's.
    let (graph, y) = no_grad(|| {
        Graph::capture(&cpu(), || {
            let t = x.add_scalar(1.0)?;
            t.mul_scalar(3.0)
        })
    })
    .unwrap();
    // Same-sized tensors made now would take a freed block of that size.
    let others: Vec<Tensor> = (0..8).map(|i| Tensor::full(&[n], -(i as f64), DType::F32, &cpu()).unwrap()).collect();
    graph.replay().unwrap();
    assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 6.0));
    for (i, t) in others.iter().enumerate() {
        assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == -(i as f32)), "tensor {i} was overwritten");
    }
    drop(graph);
    // Released: y keeps its last values and stays usable.
    assert!(y.to_vec::<f32>().unwrap().iter().all(|&v| v == 6.0));
}

#[test]
fn an_error_inside_the_closure_leaves_no_capture_behind() {
    let x = Tensor::ones(&[2, 3], DType::F32, &cpu()).unwrap();
    let err = no_grad(|| Graph::capture(&cpu(), || x.matmul(&x))).unwrap_err();
    assert!(err.to_string().contains("while capturing a graph"), "{err}");
    let (graph, y) = no_grad(|| Graph::capture(&cpu(), || x.mul_scalar(2.0))).unwrap();
    graph.replay().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [2.0; 6]);
}
