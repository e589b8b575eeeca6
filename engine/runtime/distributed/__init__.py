"""How a rank runs its part of a distributed plan, one file per parallelism (torchtitan's
apply_* layout): mesh.py the pp x dp x tp device mesh; tensor_parallel.py, data_parallel.py
and pipeline.py each one kind; stages.py the pipeline's stage graphs and checkpointed
regions; tied.py a weight tied across stages; parallelize.py the order they are applied in.
The trainer that drives them is ../parallel_trainer.py."""
