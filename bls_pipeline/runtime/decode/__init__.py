"""The rows of one execute(): the good requests' images, decoded and preprocessed once on a
device (numpy on the CPU, torch on a GPU), and the regions cut from them."""
