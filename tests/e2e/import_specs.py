"""Topology texts for the import test: one with a dangling leaf reference, one fixed."""

FIXED = """version: 1
name: lab-2
gpu_models: {A100: {peak_tflops: 312}}
switches: [{name: leaf-1, tier: leaf}]
links: []
nodes:
  - name: gpu-a
    gpu_model: A100
    gpus: 4
    nvlink: {domain: gpu-a, bw_GBps: 300, latency_us: 2.0}
    nics: [{name: ib0, gpus: [0, 1, 2, 3], leaf: leaf-1, bw_GBps: 25, latency_us: 1.5}]
  - name: gpu-b
    gpu_model: A100
    gpus: 4
    nvlink: {domain: gpu-b, bw_GBps: 300, latency_us: 2.0}
    nics: [{name: ib0, gpus: [0, 1, 2, 3], leaf: leaf-1, bw_GBps: 25, latency_us: 1.5}]
"""
BROKEN = FIXED.replace("leaf: leaf-1, bw_GBps: 25", "leaf: leaf-9, bw_GBps: 25", 1)
