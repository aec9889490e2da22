"""``python -m launcher`` is ``ft_launcher``."""

from launcher.cli import main

if __name__ == "__main__":
    main()
