"""The training engines: a policy's (torch, FSDP) and a critic's update over Hugging Face models, their settings,
the micro-batch a loss sees, and how a step's numbers combine."""
