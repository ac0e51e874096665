"""client_image package."""
