"""What every tool shares, so that each measures, describes, writes and draws the same way.

* `timer`: one timer, CPU and CUDA, samples with their median and quantiles;
* `machine`: the processor, threads, load, versions, and the matmul rate and copy
  bandwidth measured in the same run; how busy other processes kept the CPU;
* `peak`: peak CPU memory of one call;
* `results`: result files validated against their JSON Schema and written
  atomically, never over an existing file unless asked;
* `cli`: the shared command-line options and how outputs are checked and written;
* `plotting`: matplotlib without a display, figures saved through the same writer.

Modules import downwards only: timer <- machine; results <- cli, plotting. Nothing here imports a tool.
"""
