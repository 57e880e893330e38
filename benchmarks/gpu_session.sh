#!/usr/bin/env bash
# One prepared run on a borrowed CUDA machine (its python3 has torch, triton, numba, pytest and hypothesis,
# and nothing can be downloaded there): the CUDA tests, then benchmarks/gpu_check.py. What the machine lacks
# travels in .whl, named in the run's carry: wheels for its Python (gymnasium, Farama-Notifications, pettingzoo,
# minigrid, mpe2, pygame-ce, stable-baselines3; `pip download --no-deps --only-binary=:all: --python-version 3.12 --platform
# manylinux2014_x86_64 ...`) and pure-Python sdists (chess). Logs go to $OUT (default /tmp/gpu_session).
#
#     bash benchmarks/gpu_session.sh [TRAIN_SECONDS] [LARGE_ENVS]
#
# Stages, most important first, within about 8 minutes (each logs to $OUT as it goes, so a cut run keeps what it did):
# gpu_check.py (the Triton kernel; the PPO split at 4096/16384/65536 Numba gridworlds and Numba CartPole: env-only
# steps/s, collect/update ms, end-to-end steps/s, device-busy share and launches per step; a learning run to the
# gridworld's optimum), the CUDA tests (CUDA-graph rollout against eager, same seed same checkpoint, ...), the
# overlapped rollout against the synchronous one (benchmarks/overlap.py), then benchmarks/train.py --device cuda
# (CleanRL-style file, SB3 and packrl side by side; needs the SB3 wheel). The timeouts add to 470 s.
set -u
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --no-build-isolation --upgrade \
        --target /tmp/site .whl/*.whl $(ls .whl/*.tar.gz 2>/dev/null) || { echo "wheel install failed"; exit 1; }
fi
# the optional C extensions (packrl falls back to Numba without them)
python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 || echo "C extension build failed: see build.log"
nvidia-smi -L
python3 -c "import torch, numba, gymnasium; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numba', numba.__version__, 'gymnasium', gymnasium.__version__)"
timeout 200 python3 benchmarks/gpu_check.py --train-seconds "${1:-45}" 2>&1 | tee "$OUT/gpu_check.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 --durations=8 -rs \
    tests/test_cuda_training.py tests/test_advantage.py tests/test_models_policy.py tests/test_nativize.py \
    tests/test_replay_device.py tests/test_optimizer.py tests/test_rollout_step_function.py tests/test_overlap.py 2>&1 | tee "$OUT/pytest.log" | tail -40
timeout 60 python3 benchmarks/overlap.py --device cuda --bf16 --num-envs 4096,16384 --repeats 2 2>&1 \
    | tee "$OUT/overlap.log"
timeout 60 python3 benchmarks/train.py --device cuda --repeats 1 --steps 8192 --large-envs "${2:-512}" 2>&1 \
    | tee "$OUT/train_cuda.log"
