"""The fixed text of the lab's report: its sections (the handout's §6, in order), GELU's formulas, where
F.gelu lives in PyTorch's source, the references, and the words a GPT strategy is made of.

Where GELU lives was checked in pytorch/pytorch's source (ActivationGeluKernel.cu, cpu/Activation.cpp,
cuda/Activation.cpp read in the code index) and against the installed wheel: docs/gelu-in-pytorch.md.
"""

from __future__ import annotations

# (anchor, heading) of the table of contents, in the handout's §6 order
TOC = (
    ("lenet", "1. LeNet-5 on MNIST"),
    ("gelu", "2. GELU in Python, C++ and on the GPU, used in LeNet-5"),
    ("handin", "3. What is handed in"),
    ("procedure", "3.2.1 Procedure"),
    ("gpu", "3.2.2 GPU utilization during training"),
    ("tensorboard", "3.2.3 TensorBoard: loss and accuracy curves"),
    ("accuracy", "3.2.4 LeNet-5 test accuracy"),
    ("gpt", "3.2.5 Bonus: GPT-2 training time, strategies and speed-up"),
    ("pretrained", "4. No pretrained networks"),
    ("sources", "5. Code trainlab draws on; where GELU lives in PyTorch"),
    ("extra", "Beyond the handout: trainlab's own operators, data parallel"),
    ("yours", "The student's part: procedure, discussion, 思考 questions"),
    ("references", "References"),
)
HEADING = dict(TOC)

# (name in a strategy, what it is, reference key, the words that show a row uses it)
STRATEGY_WORDS = (
    ("amp", "bf16 autocast", "amp", {"amp"}),
    ("ckpt", "activation checkpointing", "ckpt", {"ckpt", "ckpt-selective"}),
    ("compile", "torch.compile", None, {"compile"}),
    ("accum", "gradient accumulation", None, {"accum"}),
    ("offload", "optimizer state and step on the CPU", None, {"offload"}),
    ("zero1/2/3", "ZeRO stages", "zero", {"zero1", "zero2", "zero3"}),
    ("tp", "tensor parallelism", "tp", {"tp"}),
    ("pp", "pipeline parallelism", "pp", {"pp"}),
    ("flash", "SDPA's flash-attention kernel, where the planner's attention column says so", "flash", {"flash"}),
)

GELU_FORMULAS = """GELU(x)  = x·Φ(x) = ½·x·(1 + erf(x/√2))                      Φ: the standard normal CDF
GELU'(x) = Φ(x) + x·φ(x),   φ(x) = exp(−x²/2)/√(2π)               φ: its density
tanh form (approximate='tanh'):  ½·x·(1 + tanh(u)),   u = √(2/π)·(x + 0.044715·x³)
its derivative:  ½·(1 + tanh u) + ½·x·(1 − tanh² u)·√(2/π)·(1 + 3·0.044715·x²)
sigmoid form (approximate='sigmoid'):  x·σ(1.702·x),   σ(z) = 1/(1 + e^−z)
its derivative:  σ(1.702·x) + 1.702·x·σ(1.702·x)·(1 − σ(1.702·x))"""

# Where F.gelu is implemented in PyTorch's source (pytorch/pytorch; checked in docs/gelu-in-pytorch.md)
GELU_SOURCE = [
    ["what", "file in pytorch/pytorch", "function"],
    ["Python entry: no Python body", "torch/nn/functional.py", "gelu = _add_docstr(torch._C._nn.gelu, …)"],
    [
        "operator schema, CPU/CUDA dispatch",
        "aten/src/ATen/native/native_functions.yaml",
        "gelu.out → gelu_out_cpu, gelu_out_cuda",
    ],
    ["derivative", "tools/autograd/derivatives.yaml", "gelu: self: gelu_backward(grad, self, approximate)"],
    ["CPU operator", "aten/src/ATen/native/Activation.cpp", "TORCH_IMPL_FUNC(gelu_out_cpu): oneDNN or GeluKernel"],
    ["CPU kernels", "aten/src/ATen/native/cpu/Activation.cpp", "GeluKernelImpl, GeluBackwardKernelImpl"],
    [
        "CUDA operator",
        "aten/src/ATen/native/cuda/Activation.cpp",
        "TORCH_IMPL_FUNC(gelu_out_cuda) → GeluCUDAKernelImpl",
    ],
    [
        "CUDA kernels",
        "aten/src/ATen/native/cuda/ActivationGeluKernel.cu",
        "GeluCUDAKernelImpl, GeluBackwardCUDAKernelImpl",
    ],
]

# (key, text): cited where the report uses what they describe
REFERENCES = {
    "pytorch": "PyTorch documentation, https://pytorch.org/docs/stable/ — torch.nn, torch.autograd.Function (“Extending "
    "PyTorch”), C++ extensions (torch.utils.cpp_extension), torch.utils.tensorboard.",
    "lenet": "Y. LeCun, L. Bottou, Y. Bengio, P. Haffner. Gradient-based learning applied to document recognition. "
    "Proceedings of the IEEE 86(11), 1998 (LeNet-5, MNIST).",
    "gelu": "D. Hendrycks, K. Gimpel. Gaussian Error Linear Units (GELUs). arXiv:1606.08415, 2016.",
    "gpt2": "A. Radford et al. Language Models are Unsupervised Multitask Learners (GPT-2). OpenAI, 2019.",
    "amp": "P. Micikevicius et al. Mixed Precision Training. ICLR 2018.",
    "ckpt": "T. Chen, B. Xu, C. Zhang, C. Guestrin. Training Deep Nets with Sublinear Memory Cost. arXiv:1604.06174, 2016.",
    "flash": "T. Dao, D. Y. Fu, S. Ermon, A. Rudra, C. Ré. FlashAttention: Fast and Memory-Efficient Exact Attention "
    "with IO-Awareness. NeurIPS 2022.",
    "zero": "S. Rajbhandari, J. Rasley, O. Ruwase, Y. He. ZeRO: Memory Optimizations Toward Training Trillion Parameter "
    "Models. SC 2020.",
    "tp": "M. Shoeybi et al. Megatron-LM: Training Multi-Billion Parameter Language Models Using Model Parallelism. "
    "arXiv:1909.08053, 2019.",
    "pp": "Y. Huang et al. GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism. NeurIPS 2019.",
}


# The handout's LeNet-5 (ReLU, max-pooling, no batch norm), for runs that predate the summary's own
# `architecture` table; tests/test_report_lab.py holds it equal to lenet.architecture's.
STANDARD_LENET5 = (
    ("layer", "output (C×H×W)", "parameters"),
    ("input: a 28×28 grey image", "1×28×28", "0"),
    ("convolution 1→6, 5×5, padding 2", "6×28×28", "156"),
    ("max pooling 2×2", "6×14×14", "0"),
    ("relu", "6×14×14", "0"),
    ("convolution 6→16, 5×5", "16×10×10", "2,416"),
    ("max pooling 2×2", "16×5×5", "0"),
    ("relu", "16×5×5", "0"),
    ("flatten", "400", "0"),
    ("fully connected 400→120", "120", "48,120"),
    ("relu", "120", "0"),
    ("fully connected 120→84", "84", "10,164"),
    ("relu", "84", "0"),
    ("fully connected 84→10", "10", "850"),
    ("total", "10 class scores", "61,706"),
)
