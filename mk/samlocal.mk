# `make sam-local`: the gateway and scaler Lambdas under `sam local`, against the emulator (emulator/samlocal.py,
# emulator/README.md). Offline: the Lambda base image is built from Debian packages (emulator/sam-base-image.sh).
# ARGS go to python -m emulator.samlocal (--warm-containers LAZY, --scaler lambda, --api-port 3001, ...).
# `make sam-invoke` runs `sam local invoke $(FUNCTION)` once against the running stack (default: the scaler).

FUNCTION ?= ScalerFunction

.PHONY: sam-local sam-invoke

sam-local: $(STAMP) $(SAM_TOOLS_STAMP)
	$(BIN)/python -m emulator.samlocal $(ARGS)

sam-invoke: $(STAMP) $(SAM_TOOLS_STAMP)
	$(BIN)/python -m emulator.samlocal invoke $(FUNCTION) $(ARGS)
