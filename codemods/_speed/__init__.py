"""What the speed codemods share (compile, tf32, cudnn-benchmark,
channels-last, fused-optim): inserting statements next to others, where a
trained model is ready, whether it is a convolutional net, and where the
script starts."""

RUNTIME = "accelmigrate.runtime.speed"
