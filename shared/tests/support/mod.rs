pub mod stand_in;
