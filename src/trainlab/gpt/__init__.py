"""GPT-2 training acceleration: `trainlab gpt bench|plan|compare`.

model (our GPT-2 + HF mapping) · strategy (parsing and validation: the one owner of every check) ·
engine (one train step for every strategy) · parallel/ (one module per strategy) · flops · planner
(memory model) · config (GPTBenchConfig, CompareConfig, PlanConfig) · plan (GPTPlan: the run resolved) · step · bench · compare · cli.
"""
