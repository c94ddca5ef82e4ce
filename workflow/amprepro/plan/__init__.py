"""How a cell is planned and started: the memory plan (memplan) that picks the batch and the
LLaMA shape each model runs at on this GPU, and the probe that checks a close call. What a cell does is amprepro.train;
the memory model both read is amprepro.memory."""
