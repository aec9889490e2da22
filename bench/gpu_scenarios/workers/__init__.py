"""Worker scripts that ``ft_launcher`` starts in the GPU check's scenarios (need torch with CUDA)."""
