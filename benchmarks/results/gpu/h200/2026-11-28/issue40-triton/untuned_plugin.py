"""pytest -p untuned_plugin: every Triton layer kernel at its first config (no autotuning: minutes less)."""


def pytest_configure(config):
    from trainlab.ops.layers import layers_triton as lt

    for name, (configs, key, interp) in list(lt.TUNING.items()):
        lt.TUNING[name] = (configs[:1], key, interp)
